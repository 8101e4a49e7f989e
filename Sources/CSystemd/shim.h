// libsystemd's daemon API: sd_notify, sd_watchdog_enabled, sd_listen_fds (Debian: libsystemd-dev).
#ifndef PUBSUB_CSYSTEMD_SHIM_H
#define PUBSUB_CSYSTEMD_SHIM_H
#include <systemd/sd-daemon.h>
#endif
