package harness

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// service is a helper process (MinIO, Azurite, fake-gcs-server) that a test can stop and
// start again. It is killed, with its process group, when the test ends.
type service struct {
	t    testing.TB
	name string
	bin  string
	args []string
	env  []string
	log  string
	cmd  *exec.Cmd
	done chan struct{}
}

func (s *service) start() {
	s.t.Helper()
	f, err := os.OpenFile(s.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		s.t.Fatal(err)
	}
	cmd := exec.Command(s.bin, s.args...)
	cmd.Env = append(os.Environ(), s.env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		s.t.Fatalf("harness: start %s: %v", s.name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); f.Close(); close(done) }()
	s.cmd, s.done = cmd, done
}

// stop SIGKILLs the process group and waits for the process.
func (s *service) stop() {
	if s.cmd == nil {
		return
	}
	select {
	case <-s.done:
		return
	default:
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		s.t.Errorf("harness: %s (pid %d) did not exit after SIGKILL", s.name, s.cmd.Process.Pid)
	}
}

func (s *service) logTail() string {
	data, _ := os.ReadFile(s.log)
	return tail(string(data), 30)
}

func toolPath(t testing.TB, name string) string {
	t.Helper()
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(root, "bin", name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s is required but missing at %s (run make tools): %v", name, p, err)
	}
	return p
}

// freePort returns a free TCP port on ip.
func freePort(t testing.TB, ip string) int {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// MinIO is a real MinIO server on loopback: the S3 store of the tests.
type MinIO struct {
	// Endpoint is the S3 endpoint, http://IP:PORT.
	Endpoint string
	User     string
	Password string
	// DataDir is where MinIO keeps its objects.
	DataDir string
	svc     *service
}

// StartMinIO starts bin/minio (built by make tools) on a fresh loopback
// address with its data under the test's temporary directory, and waits
// until it is ready.
func StartMinIO(t testing.TB) *MinIO {
	t.Helper()
	ip := AllocIP(t)
	port := freePort(t, ip)
	console := freePort(t, ip)
	dir := t.TempDir()
	m := &MinIO{
		Endpoint: fmt.Sprintf("http://%s:%d", ip, port),
		DataDir:  filepath.Join(dir, "data"),
		User:     "etcdmanager",
		Password: "etcdmanager-secret",
	}
	m.svc = &service{
		t: t, name: "minio", bin: toolPath(t, "minio"),
		args: []string{"server", m.DataDir,
			"--address", fmt.Sprintf("%s:%d", ip, port),
			"--console-address", fmt.Sprintf("%s:%d", ip, console),
			"--quiet"},
		env: []string{
			"MINIO_ROOT_USER=" + m.User, "MINIO_ROOT_PASSWORD=" + m.Password,
			"MINIO_BROWSER=off", "MINIO_UPDATE=off",
		},
		log: filepath.Join(dir, "minio.log"),
	}
	m.Start()
	t.Cleanup(m.svc.stop)
	return m
}

// Start starts MinIO (again) and waits for /minio/health/ready.
func (m *MinIO) Start() {
	t := m.svc.t
	t.Helper()
	m.svc.start()
	WaitFor(t, 60*time.Second, "minio ready", func() bool {
		select {
		case <-m.svc.done:
			t.Fatalf("minio exited:\n%s", m.svc.logTail())
		default:
		}
		resp, err := http.Get(m.Endpoint + "/minio/health/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// Stop kills MinIO; its data stays for a later Start.
func (m *MinIO) Stop() { m.svc.stop() }

// PID is the running MinIO's process ID.
func (m *MinIO) PID() int { return m.svc.cmd.Process.Pid }

// Env is the environment a client needs: the usual AWS variables.
func (m *MinIO) Env() []string {
	return []string{
		"AWS_ACCESS_KEY_ID=" + m.User, "AWS_SECRET_ACCESS_KEY=" + m.Password,
		"AWS_REGION=us-east-1", "AWS_EC2_METADATA_DISABLED=true",
	}
}

// CreateBucket makes a bucket.
func (m *MinIO) CreateBucket(t testing.TB, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := m.client().CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(name)}); err != nil {
		t.Fatalf("harness: create bucket %s: %v", name, err)
	}
}

// ETag is the ETag of the object at key in bucket; a multipart upload's
// ends in -<parts>.
func (m *MinIO) ETag(t testing.TB, bucket, key string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := m.client().HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)})
	if err != nil {
		t.Fatalf("harness: head %s/%s: %v", bucket, key, err)
	}
	return aws.ToString(out.ETag)
}

func (m *MinIO) client() *s3.Client {
	return s3.New(s3.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(m.Endpoint),
		UsePathStyle: true,
		Credentials:  credentials.NewStaticCredentialsProvider(m.User, m.Password, ""),
	})
}

// StoreURL is the s3:// store URL of prefix in bucket, in the form the
// README documents for MinIO.
func (m *MinIO) StoreURL(bucket, prefix string) string {
	q := url.Values{"endpoint": {m.Endpoint}, "region": {"us-east-1"}, "use_path_style": {"true"}}
	return (&url.URL{Scheme: "s3", Host: bucket, Path: "/" + prefix, RawQuery: q.Encode()}).String()
}

// Azurite's development account: a well-known, public name and key that
// the emulator accepts by default.
const (
	azuriteAccount = "devstoreaccount1"
	azuriteKey     = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)

// Azurite is the real Azure blob emulator (npm azurite) on loopback.
type Azurite struct {
	// Host is IP:PORT of the blob service.
	Host string
	svc  *service
}

// StartAzurite starts bin/azurite-blob (installed by make tools) on a
// fresh loopback address and waits until it answers.
func StartAzurite(t testing.TB) *Azurite {
	t.Helper()
	ip := AllocIP(t)
	port := freePort(t, ip)
	dir := t.TempDir()
	a := &Azurite{Host: fmt.Sprintf("%s:%d", ip, port)}
	a.svc = &service{
		t: t, name: "azurite", bin: toolPath(t, "azurite-blob"),
		args: []string{"--blobHost", ip, "--blobPort", fmt.Sprint(port),
			"--location", filepath.Join(dir, "data"), "--silent", "--skipApiVersionCheck",
			// Azurite sends usage data by default (DNS lookups, and the Azure
			// metadata server at 169.254.169.254): tests stay on loopback.
			"--disableTelemetry"},
		log: filepath.Join(dir, "azurite.log"),
	}
	a.svc.start()
	t.Cleanup(a.svc.stop)
	WaitFor(t, 60*time.Second, "azurite ready", func() bool {
		select {
		case <-a.svc.done:
			t.Fatalf("azurite exited:\n%s", a.svc.logTail())
		default:
		}
		c, err := net.DialTimeout("tcp", a.Host, time.Second)
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
	return a
}

// Env is the environment a client needs: the emulator's account and key.
func (a *Azurite) Env() []string {
	return []string{"AZURE_STORAGE_ACCOUNT=" + azuriteAccount, "AZURE_STORAGE_KEY=" + azuriteKey}
}

// CreateContainer makes a blob container.
func (a *Azurite) CreateContainer(t testing.TB, name string) {
	t.Helper()
	cred, err := azblob.NewSharedKeyCredential(azuriteAccount, azuriteKey)
	if err != nil {
		t.Fatal(err)
	}
	client, err := azblob.NewClientWithSharedKeyCredential(fmt.Sprintf("http://%s/%s", a.Host, azuriteAccount), cred, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := client.CreateContainer(ctx, name, nil); err != nil {
		t.Fatalf("harness: create container %s: %v", name, err)
	}
}

// StoreURL is the azblob:// store URL of prefix in container.
func (a *Azurite) StoreURL(container, prefix string) string {
	q := url.Values{"domain": {a.Host}, "protocol": {"http"}, "localemu": {"true"}}
	return (&url.URL{Scheme: "azblob", Host: container, Path: "/" + prefix, RawQuery: q.Encode()}).String()
}

// FakeGCS is the GCS emulator fake-gcs-server on loopback, serving the
// JSON and XML APIs over plain HTTP with its objects on real disk.
type FakeGCS struct {
	// Host is IP:PORT of the emulator, the value of STORAGE_EMULATOR_HOST.
	Host string
	svc  *service
	// metadata stands in for the GCE metadata server: nothing should
	// ever connect to it.
	metadata *tripwire
}

// StartFakeGCS starts bin/fake-gcs-server (built by make tools) on a fresh
// loopback address with its data under the test's temporary directory,
// and waits until its health check answers. Its log's tail is printed if
// the test fails.
func StartFakeGCS(t testing.TB) *FakeGCS {
	t.Helper()
	ip := AllocIP(t)
	port := freePort(t, ip)
	dir := t.TempDir()
	g := &FakeGCS{Host: fmt.Sprintf("%s:%d", ip, port), metadata: startTripwire(t, ip)}
	g.svc = &service{
		t: t, name: "fake-gcs-server", bin: toolPath(t, "fake-gcs-server"),
		args: []string{"-scheme", "http", "-host", ip, "-port", fmt.Sprint(port),
			"-backend", "filesystem", "-filesystem-root", filepath.Join(dir, "data"),
			// Upload sessions and XML reads name the emulator itself,
			// never storage.googleapis.com.
			"-external-url", "http://" + g.Host, "-public-host", g.Host,
			"-log-level", "warn"},
		log: filepath.Join(dir, "fake-gcs-server.log"),
	}
	g.svc.start()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("fake-gcs-server log (tail):\n%s", g.svc.logTail())
		}
		g.svc.stop()
		if hits := g.metadata.close(); len(hits) > 0 {
			t.Errorf("harness: a GCS client asked the GCE metadata server (GCE_METADATA_HOST=%s) despite STORAGE_EMULATOR_HOST: %q", g.metadata.addr, hits)
		}
	})
	WaitFor(t, 60*time.Second, "fake-gcs-server ready", func() bool {
		select {
		case <-g.svc.done:
			t.Fatalf("fake-gcs-server exited:\n%s", g.svc.logTail())
		default:
		}
		resp, err := http.Get("http://" + g.Host + "/_internal/healthcheck")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return g
}

// Env is the environment a client needs. STORAGE_EMULATOR_HOST makes
// gocloud's gcsblob (and the storage client under it) send every request
// to the emulator, without authentication and without looking for
// credentials, so no process asks the GCE metadata server or googleapis.com.
// The client's OpenTelemetry metrics, whose exporter would look up the
// project, stay off.
//
// GCE_METADATA_HOST is a guard, not a need: it points the metadata client
// at a loopback listener instead of 169.254.169.254, and the test fails if
// anything connects to it.
func (g *FakeGCS) Env() []string {
	return []string{
		"STORAGE_EMULATOR_HOST=" + g.Host,
		"GCP_STORAGE_GO_ENABLE_OTEL_METRICS=false",
		"GCE_METADATA_HOST=" + g.metadata.addr,
	}
}

// CreateBucket makes a bucket through the emulator's JSON API.
func (g *FakeGCS) CreateBucket(t testing.TB, name string) {
	t.Helper()
	body, err := json.Marshal(map[string]string{"name": name})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+g.Host+"/storage/v1/b", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("harness: create bucket %s: %v", name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		t.Fatalf("harness: create bucket %s: %s: %s", name, resp.Status, msg)
	}
}

// StoreURL is the gs:// store URL of prefix in bucket. It carries no
// emulator parameters: Env's STORAGE_EMULATOR_HOST points the client at
// the emulator.
func (g *FakeGCS) StoreURL(bucket, prefix string) string {
	return (&url.URL{Scheme: "gs", Host: bucket, Path: "/" + prefix}).String()
}

// tripwire is a loopback listener that nothing should connect to. It
// records the first line of whatever arrives.
type tripwire struct {
	addr string
	l    net.Listener
	mu   sync.Mutex
	hits []string
	done chan struct{}
}

func startTripwire(t testing.TB, ip string) *tripwire {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	w := &tripwire{addr: l.Addr().String(), l: l, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_ = c.SetReadDeadline(time.Now().Add(time.Second))
			line, _ := bufio.NewReader(c).ReadString('\n')
			c.Close()
			w.mu.Lock()
			w.hits = append(w.hits, strings.TrimSpace(line))
			w.mu.Unlock()
		}
	}()
	return w
}

// close stops the listener and returns what reached it.
func (w *tripwire) close() []string {
	w.l.Close()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.hits
}

// BackupAgent is an etcd-manager backup-agent process.
type BackupAgent struct {
	Name string
	svc  *service
}

// StartBackupAgent runs etcd-manager backup-agent with args against the
// env's store; it is killed when the test ends.
func (e *Env) StartBackupAgent(name string, args ...string) *BackupAgent {
	e.t.Helper()
	logDir := filepath.Join(e.Root, "logs")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		e.t.Fatal(err)
	}
	b := &BackupAgent{Name: name, svc: &service{
		t: e.t, name: name, bin: e.AgentBin,
		args: append([]string{"backup-agent", "--backup-store=" + e.StoreURL, "--node-id=" + name}, args...),
		env:  e.ExtraEnv,
		log:  filepath.Join(logDir, name+".log"),
	}}
	b.svc.start()
	e.t.Cleanup(b.svc.stop)
	return b
}

// Kill SIGKILLs the backup agent.
func (b *BackupAgent) Kill() { b.svc.stop() }

// Log returns the agent's log so far.
func (b *BackupAgent) Log() string {
	data, _ := os.ReadFile(b.svc.log)
	return string(data)
}
