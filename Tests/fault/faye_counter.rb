#!/usr/bin/env ruby
# Faye 1.4's Ruby client (Debian ruby-faye) as a subscriber of the fault suite: subscribes to one channel and
# prints what its application gets, until SIGTERM or the deadline.
#
#   ruby faye_counter.rb URL websocket|long-polling CHANNEL [DEADLINE_SECONDS]
#
# One JSON object per line on stdout:
#   {"event":"subscribed"}                   the subscription was confirmed (once)
#   {"event":"message","n":N}                the application got the event {"n": N}
#   {"event":"handshake"}                    the client sent a /meta/handshake (the first, or a new session)
#   {"event":"transport","state":"up"|"down"}
#   {"event":"done","reason":"..."}          last (unless killed)
# Retries come after 1 s (Faye's default is 5 s), so a fault costs seconds, not the run's budget.

require 'json'
require 'faye'

$stdout.sync = true

# EM.stop ends the reactor only after the current tick, whose other callbacks (a reply read, the next
# /meta/connect sent) still run: nothing is printed after "done", so it really is the last line.
def emit(event, fields = {})
  return if $done

  $done = true if event == 'done'
  $stdout.puts(JSON.generate({ 'event' => event }.merge(fields)))
end

class HandshakeWatcher
  def outgoing(message, callback)
    emit('handshake') if message['channel'] == '/meta/handshake'
    callback.call(message)
  end
end

url, transport, channel, deadline = ARGV
unless url && %w[websocket long-polling].include?(transport) && channel
  warn "usage: #{$PROGRAM_NAME} URL websocket|long-polling CHANNEL [DEADLINE_SECONDS]"
  exit 64
end
deadline = (deadline || 60).to_f

EM.run do
  EM.error_handler do |e|
    emit('error', 'error' => "#{e.class}: #{e.message}")
  end
  stop = lambda do |reason|
    emit('done', 'reason' => reason)
    EM.stop
  end
  # A trap may not take EventMachine's locks: it sets a flag that a timer looks at.
  $terminated = false
  Signal.trap('TERM') { $terminated = true }
  EM.add_periodic_timer(0.1) { stop.call('SIGTERM') if $terminated }
  EM.add_timer(deadline) { stop.call("deadline of #{deadline}s reached") }
  client = Faye::Client.new(url, timeout: 10, retry: 1)
  client.disable('websocket') if transport == 'long-polling'
  client.add_extension(HandshakeWatcher.new)
  client.bind('transport:up') { emit('transport', 'state' => 'up') }
  client.bind('transport:down') { emit('transport', 'state' => 'down') }
  sub = client.subscribe(channel) do |data|
    emit('message', 'n' => data.is_a?(Hash) ? data['n'] : nil)
  end
  sub.callback { emit('subscribed') }
  sub.errback { |error| emit('subscribe_failed', 'error' => error.to_s) }
end
$stdout.flush
exit!(0)
