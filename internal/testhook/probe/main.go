// Command probe passes every test hook once, for the test that proves a
// release build ignores them: it prints the clock offset it sees and
// exits 0, unless a hook crashed or paused it.
package main

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/testhook"
)

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	testhook.Here(log, "probe")
	testhook.Pause(log, "probe")
	fixed := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := testhook.Clock(func() time.Time { return fixed })
	fmt.Println(now().Sub(fixed))
}
