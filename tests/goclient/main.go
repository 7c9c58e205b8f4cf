// Command goclient drives a server with Go's own HTTP/2 client (net/http over TLS,
// h2 chosen by ALPN) until its standard input closes, then prints what it got as one
// JSON object: {"ok": N, "failed": N, "errors": [...], "connections": N}.
//
// Several goroutines share one http.Client, so their requests are multiplexed on one
// connection the way a Go service calls another; a GOAWAY moves them all to a new one.
// Only the standard library is used, so it builds offline.
package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"os"
	"sync"
	"time"
)

// maxErrors bounds the errors printed: the count says how many there were.
const maxErrors = 20

type tally struct {
	mu          sync.Mutex
	Ok          int      `json:"ok"`
	Failed      int      `json:"failed"`
	Errors      []string `json:"errors"`
	Connections int      `json:"connections"`
}

func (t *tally) fail(format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.Failed++
	if len(t.Errors) < maxErrors {
		t.Errors = append(t.Errors, fmt.Sprintf(format, args...))
	}
}

func main() {
	url := flag.String("url", "", "the URL every request GETs (a query is added)")
	caFile := flag.String("ca", "", "PEM file of the CA the server's certificate is from")
	want := flag.String("want", "", "text every answer's body must hold")
	workers := flag.Int("workers", 4, "goroutines requesting at once")
	limit := flag.Duration("max", time.Minute, "stop after this long even if stdin stays open")
	flag.Parse()

	pem, err := os.ReadFile(*caFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		fmt.Fprintln(os.Stderr, "no certificate in", *caFile)
		os.Exit(2)
	}
	// A TLS config of our own turns net/http's automatic HTTP/2 off unless asked for.
	transport := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots},
		ForceAttemptHTTP2: true}
	client := &http.Client{Transport: transport, Timeout: 20 * time.Second}

	result := &tally{Errors: []string{}}
	trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
		if !info.Reused {
			result.mu.Lock()
			result.Connections++
			result.mu.Unlock()
		}
	}}

	stop := make(chan struct{})
	go func() {
		io.Copy(io.Discard, os.Stdin)
		close(stop)
	}()
	deadline := time.After(*limit)

	var group sync.WaitGroup
	for n := 0; n < *workers; n++ {
		group.Add(1)
		go func(n int) {
			defer group.Done()
			for seq := 0; ; seq++ {
				select {
				case <-stop:
					return
				case <-deadline:
					return
				default:
				}
				get(client, trace, fmt.Sprintf("%s?go%d-%d", *url, n, seq), []byte(*want), result)
			}
		}(n)
	}
	group.Wait()
	json.NewEncoder(os.Stdout).Encode(result)
}

// get makes one request and counts its answer: 200 over HTTP/2 with the wanted body.
func get(client *http.Client, trace *httptrace.ClientTrace, url string, want []byte, result *tally) {
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		result.fail("%v", err)
		return
	}
	reply, err := client.Do(req.WithContext(httptrace.WithClientTrace(req.Context(), trace)))
	if err != nil {
		result.fail("%v", err)
		return
	}
	body, err := io.ReadAll(reply.Body)
	reply.Body.Close()
	switch {
	case err != nil:
		result.fail("%s: body: %v", url, err)
	case reply.StatusCode != 200 || reply.ProtoMajor != 2 || !bytes.Contains(body, want):
		result.fail("%s: %s %d %q", url, reply.Proto, reply.StatusCode, body)
	default:
		result.mu.Lock()
		result.Ok++
		result.mu.Unlock()
	}
}
