package controller

import (
	"fmt"
	"net"
	"net/http"
	"testing"
)

// The runtime profiles are served only when asked for.
func TestMetricsServePprof(t *testing.T) {
	for _, pprof := range []bool{false, true} {
		t.Run(fmt.Sprint("pprof=", pprof), func(t *testing.T) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := l.Addr().String()
			l.Close()
			stop, err := newMetrics().serve(addr, nil, nil, pprof)
			if err != nil {
				t.Fatal(err)
			}
			defer stop()
			for path, want := range map[string]int{
				"/metrics":                  http.StatusOK,
				"/debug/pprof/":             map[bool]int{false: http.StatusNotFound, true: http.StatusOK}[pprof],
				"/debug/pprof/heap?debug=1": map[bool]int{false: http.StatusNotFound, true: http.StatusOK}[pprof],
			} {
				resp, err := http.Get("http://" + addr + path)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != want {
					t.Errorf("GET %s: %d, want %d", path, resp.StatusCode, want)
				}
			}
		})
	}
}
