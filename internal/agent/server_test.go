package agent

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
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
			stop, err := serve(addr, newMetrics().reg, nil, nil, pprof)
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

// /healthz says the agent runs; /readyz answers 503 with the reason until
// ready reports ok.
func TestMetricsServeHealth(t *testing.T) {
	for _, tt := range []struct {
		name       string
		ready      func() (bool, string)
		wantStatus int
		wantBody   string
	}{
		{name: "not told", ready: nil, wantStatus: http.StatusServiceUnavailable, wantBody: "starting\n"},
		{name: "not ready", ready: func() (bool, string) { return false, "etcd is not a member yet" },
			wantStatus: http.StatusServiceUnavailable, wantBody: "etcd is not a member yet\n"},
		{name: "ready", ready: func() (bool, string) { return true, "etcd serves" }, wantStatus: http.StatusOK, wantBody: "etcd serves\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := l.Addr().String()
			l.Close()
			stop, err := serve(addr, newMetrics().reg, tt.ready, nil, false)
			if err != nil {
				t.Fatal(err)
			}
			defer stop()
			get := func(path string) (int, string) {
				resp, err := http.Get("http://" + addr + path)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				body, _ := io.ReadAll(resp.Body)
				return resp.StatusCode, string(body)
			}
			if code, body := get("/healthz"); code != http.StatusOK || body != "ok\n" {
				t.Errorf("/healthz: %d %q, want 200 \"ok\"", code, body)
			}
			if code, body := get("/readyz"); code != tt.wantStatus || body != tt.wantBody {
				t.Errorf("/readyz: %d %q, want %d %q", code, body, tt.wantStatus, tt.wantBody)
			}
		})
	}
}

// pprof's seconds are capped: a profile asked for an hour runs a minute,
// within the server's write timeout.
func TestPprofSecondsCapped(t *testing.T) {
	tests := []struct{ query, want string }{
		{"seconds=5", "5"},
		{"seconds=3600", "60"},
		{"seconds=-1", "60"},
		{"seconds=abc", "60"},
		{"", ""},
	}
	for _, tt := range tests {
		var got string
		h := capSeconds(func(_ http.ResponseWriter, r *http.Request) { got = r.URL.Query().Get("seconds") })
		h(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/debug/pprof/profile?"+tt.query, nil))
		if got != tt.want {
			t.Errorf("?%s: the profile runs %q seconds, want %q", tt.query, got, tt.want)
		}
	}
}
