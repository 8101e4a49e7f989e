// A Centrifuge node for scripts/bench-vs-faye: the Go library under Centrifugo (Debian's
// golang-github-centrifugal-centrifuge-dev, 0.15), with its memory broker, anonymous clients and client-side
// publish, serving its JSON protocol over WebSocket at /connection/websocket. Its shape is the library's own
// benchmark server (_examples/ws_benchmarks/benchmark_gorilla), bound to loopback on the port given.
//
//	GOPATH=/usr/share/gocode GO111MODULE=off go build -o centrifuge-node scripts/centrifuge-node/main.go
//	centrifuge-node -port 8000
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/centrifugal/centrifuge"
)

func main() {
	port := flag.Int("port", 8000, "TCP port on 127.0.0.1")
	flag.Parse()

	cfg := centrifuge.DefaultConfig
	cfg.LogLevel = centrifuge.LogLevelError
	cfg.LogHandler = func(e centrifuge.LogEntry) { log.Printf("%s: %+v", e.Message, e.Fields) }
	node, err := centrifuge.New(cfg)
	if err != nil {
		log.Fatal(err)
	}

	// Anonymous: every connection is accepted, with an empty user.
	node.OnConnecting(func(ctx context.Context, e centrifuge.ConnectEvent) (centrifuge.ConnectReply, error) {
		return centrifuge.ConnectReply{Credentials: &centrifuge.Credentials{UserID: ""}}, nil
	})
	node.OnConnect(func(client *centrifuge.Client) {
		client.OnSubscribe(func(e centrifuge.SubscribeEvent, cb centrifuge.SubscribeCallback) {
			cb(centrifuge.SubscribeReply{}, nil)
		})
		// A reply without a result: the node publishes the client's data itself.
		client.OnPublish(func(e centrifuge.PublishEvent, cb centrifuge.PublishCallback) {
			cb(centrifuge.PublishReply{}, nil)
		})
	})
	if err := node.Run(); err != nil {
		log.Fatal(err)
	}

	http.Handle("/connection/websocket", centrifuge.NewWebsocketHandler(node, centrifuge.WebsocketConfig{
		WriteTimeout: time.Second,
	}))
	server := &http.Server{Addr: fmt.Sprintf("127.0.0.1:%d", *port)}
	go func() {
		if err := server.ListenAndServe(); err != nil && err != http.ErrServerClosed {
			log.Fatal(err)
		}
	}()

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	<-signals
	_ = server.Close()
	_ = node.Shutdown(context.Background())
}
