// A loopback HTTP target for the load generator comparisons: fast enough (Go, all cores)
// that it is not the bottleneck unless asked to be.
//
//	go run target.go -addr 127.0.0.1:18090 -mode trivial         # 200 "ok" at once
//	go run target.go -addr 127.0.0.1:18090 -mode sleep -sleep 2ms # each response after 2 ms
//	go run target.go -addr 127.0.0.1:18090 -mode stall            # pauses 1 s every 5 s
//	go run target.go -addr 127.0.0.1:18090 -mode workers -workers 4 -sleep 10ms
//	                                              # 4 workers of 10 ms: capacity 400 req/s
//
// GET /count returns the number of requests served (other paths) so far: the comparison
// scripts read it to count requests the same way for every tool.
package main

import (
	"flag"
	"fmt"
	"log"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:18090", "listen address")
	mode := flag.String("mode", "trivial", "trivial | sleep | stall | workers")
	workers := flag.Int("workers", 4, "workers mode: requests served at once (others queue)")
	sleep := flag.Duration("sleep", 2*time.Millisecond, "service time in sleep mode")
	every := flag.Duration("stall-every", 5*time.Second, "stall mode: period")
	stall := flag.Duration("stall-for", time.Second, "stall mode: pause at the start of each period")
	flag.Parse()

	var served atomic.Int64
	start := time.Now()
	body := []byte("ok")
	slots := make(chan struct{}, *workers)
	http.HandleFunc("/count", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(strconv.FormatInt(served.Load(), 10)))
	})
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		switch *mode {
		case "sleep":
			time.Sleep(*sleep)
		case "workers":
			// Queue for a worker; a client that gave up leaves the queue (no zombie work).
			select {
			case slots <- struct{}{}:
			case <-r.Context().Done():
				return
			}
			time.Sleep(*sleep)
			<-slots
		case "stall":
			// Every request that arrives during a pause waits until the pause ends.
			phase := time.Since(start) % *every
			if phase < *stall {
				time.Sleep(*stall - phase)
			}
		}
		served.Add(1)
		w.Header().Set("Content-Type", "text/plain")
		w.Write(body)
	})
	fmt.Printf("listening on %s mode=%s\n", *addr, *mode)
	log.Fatal(http.ListenAndServe(*addr, nil))
}
