package agent

import (
	"context"
	"fmt"
	"net"
	"net/http"
	httppprof "net/http/pprof"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// serve serves gather's metrics under /metrics on addr until the returned stop is called, with
// /healthz (the agent runs) and /readyz (ready reports ok) beside it, and
// Go's runtime profiles under /debug/pprof/ when pprof is set.
func serve(addr string, gather prometheus.Gatherer, ready func() (bool, string), status http.Handler, pprof bool) (stop func(), err error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(gather, promhttp.HandlerOpts{}))
	if status != nil {
		mux.Handle("/status", status)
	}
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		ok, why := false, "starting"
		if ready != nil {
			ok, why = ready()
		}
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprintln(w, why)
	})
	if pprof {
		mux.HandleFunc("/debug/pprof/", httppprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", httppprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", capSeconds(httppprof.Profile))
		mux.HandleFunc("/debug/pprof/symbol", httppprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", capSeconds(httppprof.Trace))
	}
	// A profile or trace runs for its seconds, within the write timeout.
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: maxProfileSeconds*time.Second + 30*time.Second, IdleTimeout: 2 * time.Minute}
	go func() { _ = srv.Serve(l) }() // returns when stop shuts it down
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}, nil
}

// maxProfileSeconds caps pprof's seconds: a profile or trace asked for
// longer runs this long.
const maxProfileSeconds = 60

// capSeconds caps the seconds query of a pprof handler.
func capSeconds(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if v := r.URL.Query().Get("seconds"); v != "" {
			if n, err := strconv.Atoi(v); err != nil || n > maxProfileSeconds || n < 1 {
				q := r.URL.Query()
				q.Set("seconds", strconv.Itoa(maxProfileSeconds))
				r.URL.RawQuery = q.Encode()
			}
		}
		h(w, r)
	}
}
