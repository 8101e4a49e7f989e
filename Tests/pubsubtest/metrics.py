"""The broker's /metrics (Prometheus text) as the suites read it: `scrape()`, `metric()`, and waits on its gauges
for what a test cannot see otherwise (a request sent in the background being held: `wait_held`)."""

import requests

from .wait import wait_until

HTTP_TIMEOUT = 10


def metrics_url(target):
    """The /metrics URL of a Broker (on its own port), or `target` itself when it is a URL."""
    return target if isinstance(target, str) else f"http://127.0.0.1:{target.port}/metrics"


def scrape(target, **kw):
    """Parses /metrics with prometheus_client's parser: {(name, frozenset(labels)): value}. `target` is a Broker
    or a /metrics URL; keywords go to requests.get (verify, cert...)."""
    from prometheus_client.parser import text_string_to_metric_families
    r = requests.get(metrics_url(target), timeout=HTTP_TIMEOUT, **kw)
    assert r.status_code == 200, (r.status_code, r.text)
    assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4"), r.headers
    samples = {}
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def metric(samples, name, **labels):
    return samples.get((name, frozenset(labels.items())), 0.0)


def held(target, transport="long-polling"):
    """How many clients of `transport` the broker has attached now (pubsub_clients): for long-polling, the
    connects it holds."""
    return metric(scrape(target), "pubsub_clients", transport=transport)


def wait_held(target, count, transport="long-polling", timeout=5):
    """Waits until the broker holds at least `count` clients of `transport` (see held())."""
    return wait_until(lambda: held(target, transport) >= count, timeout,
                      message=f"{count} {transport} client(s) held by the broker")
