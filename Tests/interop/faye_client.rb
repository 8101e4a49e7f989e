#!/usr/bin/env ruby
# Drives the Faye 1.4 Ruby client (Debian ruby-faye: Faye::Client on EventMachine) against a Bayeux server.
#
#   ruby faye_client.rb URL TRANSPORT SCENARIO [DEADLINE_SECONDS]
#
#   TRANSPORT  websocket | long-polling   (long-polling calls client.disable('websocket'))
#   SCENARIO   pubsub       a and b both subscribe to one channel, each publishes once, each must receive both
#              wildcard     a subscribes to /room/* and /deep/**, b publishes to matching and non-matching channels
#              unsubscribe  a receives one message, unsubscribes, b publishes again: a must not get it
#
# Prints one JSON object per line on stdout:
#   {"event":"wire","client":"a","dir":"out"|"in","message":{...}}   every message through the client's extensions
#   {"event":"subscribed"|"message"|"published"|"unsubscribed"|"disconnected"|..., ...}
#   {"event":"done","ok":true|false,"reason":"..."}                    always last (unless the process is killed)
# Exit status 0 when the scenario ran to its end, 1 when it failed, 2 on deadline, 64 on bad usage.
# Whether what was received is right is decided by the caller, from these lines.

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

# Records every message the client sends and receives, after the client's own processing.
class WireRecorder
  def initialize(name)
    @name = name
  end

  def outgoing(message, callback)
    emit('wire', 'client' => @name, 'dir' => 'out', 'message' => message)
    callback.call(message)
  end

  def incoming(message, callback)
    emit('wire', 'client' => @name, 'dir' => 'in', 'message' => message)
    callback.call(message)
  end
end

# Calls a block when a reply on a given meta channel arrives (Faye's unsubscribe has no callback of its own).
class ReplyWatcher
  def initialize
    @waiters = []
  end

  def on_reply(channel, &block)
    @waiters << [channel, block]
  end

  def incoming(message, callback)
    callback.call(message)
    return unless message.key?('successful')
    ready, @waiters = @waiters.partition { |channel, _| channel == message['channel'] }
    ready.each { |_, block| block.call(message) }
  end
end

class Scenario
  GRACE = 0.5 # seconds to keep listening after the last expected message, to catch extra deliveries

  def initialize(url, transport)
    @url = url
    @transport = transport
    @clients = {}
    @watchers = {}
    @finished = false
  end

  def client(name)
    @clients[name] ||= begin
      c = Faye::Client.new(@url, timeout: 30)
      c.disable('websocket') if @transport == 'long-polling'
      c.add_extension(WireRecorder.new(name))
      @watchers[name] = ReplyWatcher.new
      c.add_extension(@watchers[name])
      c
    end
  end

  def watcher(name)
    client(name)
    @watchers[name]
  end

  def subscribe(name, channel, &on_ready)
    sub = client(name).subscribe(channel)
    sub.with_channel do |chan, data|
      emit('message', 'client' => name, 'subscription' => channel, 'channel' => chan, 'data' => data)
      yield_message(name, channel, chan, data)
    end
    sub.callback do
      emit('subscribed', 'client' => name, 'channel' => channel)
      on_ready.call(sub) if on_ready
    end
    sub.errback do |error|
      emit('subscribe_failed', 'client' => name, 'channel' => channel, 'error' => error.to_s)
      finish(false, "subscribe #{channel} by #{name} failed: #{error}")
    end
    sub
  end

  def publish(name, channel, data)
    pub = client(name).publish(channel, data)
    pub.callback { emit('published', 'client' => name, 'channel' => channel, 'data' => data) }
    pub.errback do |error|
      emit('publish_failed', 'client' => name, 'channel' => channel, 'data' => data, 'error' => error.to_s)
      finish(false, "publish to #{channel} by #{name} failed: #{error}")
    end
    pub
  end

  # Overridden by scenarios that react to deliveries.
  def yield_message(_name, _subscription, _channel, _data); end

  def after_grace(&block)
    EM.add_timer(GRACE, &block)
  end

  # Disconnects every client (bounded wait for the replies), then stops the reactor.
  def finish(ok, reason = nil)
    return if @finished
    @finished = true
    pending = @clients.keys
    stop = lambda do
      emit('done', 'ok' => ok, 'reason' => reason)
      $exit_status = ok ? 0 : 1
      EM.stop
    end
    return stop.call if pending.empty?
    @clients.each do |name, c|
      # The transport object the client ended up with (Faye::Transport::WebSocket or ::Http).
      transport = c.instance_variable_get(:@dispatcher)&.instance_variable_get(:@transport)
      emit('transport', 'client' => name, 'class' => transport.class.name,
                        'connection_type' => transport.respond_to?(:connection_type) ? transport.connection_type : nil)
    end
    timer = EM.add_timer(3) do
      emit('disconnect_timeout', 'clients' => pending)
      stop.call
    end
    @clients.each do |name, c|
      promise = c.disconnect
      if promise.respond_to?(:callback)
        done = lambda do |status, error = nil|
          emit('disconnected', 'client' => name, 'status' => status, 'error' => error && error.to_s)
          pending.delete(name)
          if pending.empty?
            EM.cancel_timer(timer)
            stop.call
          end
        end
        promise.callback { done.call('ok') }
        promise.errback { |e| done.call('failed', e) }
      else
        emit('disconnected', 'client' => name, 'status' => 'not-connected')
        pending.delete(name)
      end
    end
    if pending.empty?
      EM.cancel_timer(timer)
      stop.call
    end
  end
end

# a and b subscribe to the same channel; a publishes, b publishes; both must receive both events.
class PubSubScenario < Scenario
  CHANNEL = '/interop/chat'

  def run
    @received = Hash.new { |h, k| h[k] = [] }
    ready = []
    %w[a b].each do |name|
      subscribe(name, CHANNEL) do
        ready << name
        if ready.size == 2
          publish('a', CHANNEL, { 'from' => 'a', 'text' => 'hello from a' })
          publish('b', CHANNEL, { 'from' => 'b', 'text' => 'hello from b', 'n' => [1, 2.5, nil, true] })
        end
      end
    end
  end

  def yield_message(name, _subscription, _channel, data)
    @received[name] << data
    return unless @received['a'].size >= 2 && @received['b'].size >= 2
    after_grace { finish(true) }
  end
end

# a subscribes to /room/* and /deep/**; b publishes to channels that do and do not match.
class WildcardScenario < Scenario
  def run
    ready = 0
    %w[/room/* /deep/**].each do |pattern|
      subscribe('a', pattern) do
        ready += 1
        next unless ready == 2
        # b must be connected before it publishes; subscribing it to an unrelated channel does that.
        subscribe('b', '/b/inbox') do
          [
            ['/room/lobby', 1],     # matches /room/*
            ['/room/lobby/sub', 2], # too deep for /room/*
            ['/room', 3],           # the parent itself does not match /room/*
            ['/roomy', 4],          # shares a prefix only
            ['/deep/a/b/c', 5],     # matches /deep/**
            ['/deep', 6],           # /deep/** does not match /deep itself
            ['/room/last', 7]       # matches /room/*; published last
          ].each { |channel, n| publish('b', channel, { 'n' => n }) }
        end
      end
    end
  end

  def yield_message(_name, _subscription, channel, _data)
    return unless channel == '/room/last'
    after_grace { finish(true) }
  end
end

# a receives a message on /interop/topic, unsubscribes, then b publishes again on it and then on /interop/sentinel.
class UnsubscribeScenario < Scenario
  TOPIC = '/interop/topic'
  SENTINEL = '/interop/sentinel'

  def run
    @topic_sub = nil
    subscribe('a', SENTINEL) do
      @topic_sub = subscribe('a', TOPIC) do
        subscribe('b', '/b/inbox') do
          publish('b', TOPIC, { 'n' => 1, 'phase' => 'before-unsubscribe' })
        end
      end
    end
  end

  def yield_message(name, _subscription, channel, data)
    return unless name == 'a'
    if channel == TOPIC && data['n'] == 1
      watcher('a').on_reply('/meta/unsubscribe') do |reply|
        emit('unsubscribed', 'client' => 'a', 'reply' => reply)
        unless reply['successful']
          finish(false, "unsubscribe failed: #{reply['error']}")
          next
        end
        publish('b', TOPIC, { 'n' => 2, 'phase' => 'after-unsubscribe' }).callback do
          publish('b', SENTINEL, { 'n' => 3 })
        end
      end
      @topic_sub.cancel
    elsif channel == SENTINEL
      after_grace { finish(true) }
    end
  end
end

SCENARIOS = {
  'pubsub' => PubSubScenario,
  'wildcard' => WildcardScenario,
  'unsubscribe' => UnsubscribeScenario
}.freeze

url, transport, scenario_name, deadline = ARGV
unless url && %w[websocket long-polling].include?(transport) && SCENARIOS.key?(scenario_name)
  warn "usage: #{$PROGRAM_NAME} URL websocket|long-polling #{SCENARIOS.keys.join('|')} [DEADLINE_SECONDS]"
  exit 64
end
deadline = (deadline || 20).to_f

if ENV['FAYE_CLIENT_DEBUG']
  Faye.logger = Logger.new($stderr)
  Faye.logger.level = Logger::DEBUG
end

$exit_status = 1
EM.run do
  EM.error_handler do |e|
    emit('error', 'error' => "#{e.class}: #{e.message}", 'backtrace' => (e.backtrace || []).first(5))
    $exit_status = 1
    EM.stop
  end
  EM.add_timer(deadline) do
    emit('done', 'ok' => false, 'reason' => "deadline of #{deadline}s reached")
    $exit_status = 2
    EM.stop
  end
  SCENARIOS.fetch(scenario_name).new(url, transport).run
end
$stdout.flush
# Faye keeps sockets and timers; exit without running their finalizers.
exit!($exit_status)
