#!/usr/bin/env ruby
# Faye's Ruby client (Debian ruby-faye 1.4) with a fresh JWT before every handshake, as an app would: an extension
# fetches a token from TOKEN_URL (the app's login endpoint) whenever it sends /meta/handshake.
#
#   ruby faye_token_client.rb URL TOKEN_URL CHANNEL SECONDS
#
# Prints one JSON object per line: {"event":"wire","dir":"out"|"in","message":{...}}, {"event":"token"},
# {"event":"message","data":...}, and {"event":"done"} after SECONDS.

require 'json'
require 'net/http'
require 'faye'

$stdout.sync = true

# EM.stop ends the reactor only after the current tick, whose other callbacks (a reply read, the next
# /meta/connect sent) still run: nothing is printed after "done", so it really is the last line.
def emit(event, fields = {})
  return if $done

  $done = true if event == 'done'
  $stdout.puts(JSON.generate({ 'event' => event }.merge(fields)))
end

class FreshToken
  def initialize(token_url)
    @token_url = URI(token_url)
  end

  def outgoing(message, callback)
    if message['channel'] == '/meta/handshake'
      token = Net::HTTP.get(@token_url)
      emit('token')
      message['ext'] = (message['ext'] || {}).merge('token' => token)
    end
    emit('wire', 'dir' => 'out', 'message' => message)
    callback.call(message)
  end

  def incoming(message, callback)
    emit('wire', 'dir' => 'in', 'message' => message)
    callback.call(message)
  end
end

url, token_url, channel, seconds = ARGV
EM.run do
  client = Faye::Client.new(url, timeout: 30)
  client.disable('websocket') if ENV['FAYE_DISABLE_WEBSOCKET'] == '1'
  client.add_extension(FreshToken.new(token_url))
  client.subscribe(channel) { |data| emit('message', 'data' => data) }
  EM.add_timer(seconds.to_f) do
    emit('done')
    EM.stop
  end
end
