package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// A file that begins like a GGUF model, 3 MiB of random bytes after.
func testFile() []byte {
	b := make([]byte, 3<<20)
	rand.New(rand.NewSource(1)).Read(b)
	copy(b, "GGUF")
	return b
}

// fileServer serves body at /m/model-Q4_K_M.gguf the way a test asks: with
// or without Range support, dropping the first `drops` responses halfway,
// publishing a sha256 (X-Linked-Etag) that may be wrong. It records each
// request's Range header.
type fileServer struct {
	body      []byte
	ranges    bool
	drops     int
	published string
	mu        sync.Mutex
	seen      []string
}

func (f *fileServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.serveTagged(w, r, `"v1"`)
}

func (f *fileServer) serveTagged(w http.ResponseWriter, r *http.Request, etag string) {
	f.mu.Lock()
	f.seen = append(f.seen, r.Header.Get("Range"))
	drop := f.drops > 0
	if drop {
		f.drops--
	}
	f.mu.Unlock()
	if f.published != "" {
		w.Header().Set("X-Linked-Etag", `"`+f.published+`"`)
	}
	w.Header().Set("ETag", etag)
	start := 0
	if rng := r.Header.Get("Range"); f.ranges && rng != "" {
		start, _ = strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(rng, "bytes="), "-"))
		w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", start, len(f.body)-1, len(f.body)))
		w.Header().Set("Content-Length", strconv.Itoa(len(f.body)-start))
		w.WriteHeader(http.StatusPartialContent)
	} else {
		w.Header().Set("Content-Length", strconv.Itoa(len(f.body)))
	}
	rest := f.body[start:]
	if drop {
		// Half of what is left, then the connection goes.
		w.Write(rest[:len(rest)/2])
		w.(http.Flusher).Flush()
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close()
		return
	}
	w.Write(rest)
}

func sum(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

func listed(t *testing.T, s Store) []string {
	t.Helper()
	entries, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name)
	}
	return names
}

func TestPullResumesADroppedDownloadWithRange(t *testing.T) {
	body := testFile()
	fs := &fileServer{body: body, ranges: true, drops: 2, published: sum(body)}
	srv := httptest.NewServer(fs)
	defer srv.Close()
	s := Store{t.TempDir()}
	path, err := s.Pull(context.Background(), srv.URL+"/m/model-Q4_K_M.gguf", PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(path)
	if sum(got) != sum(body) || filepath.Base(path) != "model-Q4_K_M.gguf" {
		t.Fatalf("%s: %d bytes", path, len(got))
	}
	// Three requests: the whole file, then twice from where it stopped.
	if len(fs.seen) != 3 || fs.seen[0] != "" || fs.seen[1] != fmt.Sprintf("bytes=%d-", len(body)/2) || fs.seen[2] == "" {
		t.Fatalf("ranges asked: %q", fs.seen)
	}
	if names := listed(t, s); len(names) != 1 || names[0] != "model-Q4_K_M" {
		t.Fatalf("%v", names)
	}
}

func TestPullStartsOverWhereTheServerHasNoRanges(t *testing.T) {
	body := testFile()
	fs := &fileServer{body: body, ranges: false, drops: 1}
	srv := httptest.NewServer(fs)
	defer srv.Close()
	s := Store{t.TempDir()}
	path, err := s.Pull(context.Background(), srv.URL+"/m/model-Q4_K_M.gguf", PullOptions{SHA256: sum(body)})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(path)
	if sum(got) != sum(body) || len(fs.seen) != 2 || fs.seen[1] == "" {
		t.Fatalf("%d bytes; ranges asked: %q", len(got), fs.seen)
	}
}

func TestAWrongChecksumLeavesNothingBehind(t *testing.T) {
	body := testFile()
	for _, published := range []string{strings.Repeat("ab", 32), ""} {
		fs := &fileServer{body: body, ranges: true, published: published}
		srv := httptest.NewServer(fs)
		s := Store{t.TempDir()}
		opt := PullOptions{}
		if published == "" {
			opt.SHA256 = strings.Repeat("cd", 32) // the user's
		}
		_, err := s.Pull(context.Background(), srv.URL+"/m/model-Q4_K_M.gguf", opt)
		srv.Close()
		if err == nil || !strings.Contains(err.Error(), "sha256") {
			t.Fatalf("%v", err)
		}
		left, _ := filepath.Glob(filepath.Join(s.Dir, "*", "*"))
		top, _ := filepath.Glob(filepath.Join(s.Dir, "*.gguf"))
		if len(listed(t, s)) != 0 || len(left) != 0 || len(top) != 0 {
			t.Fatalf("left behind: %v %v", left, top)
		}
	}
}

func TestAnInterruptedPullResumesInTheNextOne(t *testing.T) {
	body := testFile()
	// The first pull's connection drops and it may not retry: the partial
	// file stays, unlisted; the second resumes it.
	fs := &fileServer{body: body, ranges: true, drops: 1, published: sum(body)}
	srv := httptest.NewServer(fs)
	defer srv.Close()
	s := Store{t.TempDir()}
	url := srv.URL + "/m/model-Q4_K_M.gguf"
	if _, err := s.Pull(context.Background(), url, PullOptions{Retries: -1}); err == nil {
		t.Fatal("the dropped pull succeeded")
	}
	partial := filepath.Join(s.Dir, ".partial", "model-Q4_K_M.gguf.partial")
	if fi, err := os.Stat(partial); err != nil || fi.Size() != int64(len(body)/2) {
		t.Fatalf("partial: %v %v", fi, err)
	}
	if names := listed(t, s); len(names) != 0 {
		t.Fatalf("a partial file is listed: %v", names)
	}
	if _, err := s.Pull(context.Background(), url, PullOptions{}); err != nil {
		t.Fatal(err)
	}
	if last := fs.seen[len(fs.seen)-1]; last != fmt.Sprintf("bytes=%d-", len(body)/2) {
		t.Fatalf("ranges asked: %q", fs.seen)
	}
	if _, err := os.Stat(partial); !os.IsNotExist(err) {
		t.Fatalf("the partial file is still there: %v", err)
	}
}

func TestHuggingFaceRepositoriesResolveAsLlamaCppResolvesThem(t *testing.T) {
	body := testFile()
	commit := strings.Repeat("0123456789", 4)
	files := &fileServer{body: body, ranges: true}
	mux := http.NewServeMux()
	mux.HandleFunc("/api/models/user/repo-GGUF/refs", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"branches": [{"name": "dev", "targetCommit": "%s"}, {"name": "main", "targetCommit": "%s"}]}`,
			strings.Repeat("f", 40), commit)
	})
	mux.HandleFunc("/api/models/user/repo-GGUF/tree/"+commit, func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `[{"type": "file", "path": "README.md"},
			{"type": "file", "path": "mmproj-Q8_0.gguf", "lfs": {"oid": "%s"}},
			{"type": "file", "path": "repo-Q8_0.gguf", "lfs": {"oid": "%s"}},
			{"type": "file", "path": "repo-Q4_K_M.gguf", "lfs": {"oid": "%s"}}]`,
			strings.Repeat("1", 64), sum(body), sum(body))
	})
	var asked []string
	mux.HandleFunc("/user/repo-GGUF/resolve/"+commit+"/", func(w http.ResponseWriter, r *http.Request) {
		asked = append(asked, r.URL.Path)
		files.ServeHTTP(w, r)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	s := Store{t.TempDir()}
	for _, c := range []struct{ ref, file string }{
		{"user/repo-GGUF", "repo-Q4_K_M"},          // Q4_K_M first
		{"hf.co/user/repo-GGUF:q8_0", "repo-Q8_0"}, // any case; mmproj skipped
	} {
		path, err := s.Pull(context.Background(), c.ref, PullOptions{Endpoint: srv.URL})
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Base(path) != c.file+".gguf" {
			t.Fatalf("%s: %s (asked %v)", c.ref, path, asked)
		}
	}
	if _, err := s.Pull(context.Background(), "user/repo-GGUF:Q2_K", PullOptions{Endpoint: srv.URL}); err == nil ||
		!strings.Contains(err.Error(), "repo-Q8_0.gguf") {
		t.Fatalf("%v", err)
	}
	for _, bad := range []string{"user/../etc", "ftp://x/y.gguf", "justaname"} {
		if _, err := s.Pull(context.Background(), bad, PullOptions{Endpoint: srv.URL}); err == nil {
			t.Fatalf("%q was accepted", bad)
		}
	}
}

func TestAFileThatIsNotGGUFIsRemoved(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "<html>not found</html>")
	}))
	defer srv.Close()
	s := Store{t.TempDir()}
	if _, err := s.Pull(context.Background(), srv.URL+"/x.gguf", PullOptions{}); err == nil ||
		!strings.Contains(err.Error(), "not a GGUF") {
		t.Fatalf("%v", err)
	}
	if len(listed(t, s)) != 0 {
		t.Fatal("listed")
	}
}

func TestReadInfoOfGemma(t *testing.T) {
	path := os.Getenv("M40_GEMMA_GGUF")
	if path == "" {
		t.Skip("M40_GEMMA_GGUF is not set")
	}
	info, err := ReadInfo(path)
	if err != nil {
		t.Fatal(err)
	}
	// Gemma 3 270M as its model card and gguf-py describe it.
	if info.Architecture != "gemma3" || info.ContextLength != 32768 || info.Parameters < 260e6 ||
		info.Parameters > 280e6 || !strings.Contains(info.TypeMix(), "Q") {
		t.Fatalf("%+v %s", info, info.TypeMix())
	}
	// Cut short anywhere, the header is an error, never a panic.
	whole, _ := os.ReadFile(path)
	dir := t.TempDir()
	for _, n := range []int{0, 3, 10, 24, 100, 5000, 100000} {
		cut := filepath.Join(dir, "cut.gguf")
		os.WriteFile(cut, whole[:n], 0o644)
		if _, err := ReadInfo(cut); err == nil {
			t.Fatalf("%d bytes: no error", n)
		}
	}
}

func TestTheChecksumOnARedirectIsChecked(t *testing.T) {
	body := testFile()
	mux := http.NewServeMux()
	// As Hugging Face does: the sha256 on the redirect, the file elsewhere.
	published := strings.Repeat("ab", 32)
	mux.HandleFunc("/user/repo/resolve/main/model-Q4_K_M.gguf", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Linked-Etag", `"`+published+`"`)
		http.Redirect(w, r, "/cdn/blob", http.StatusFound)
	})
	mux.Handle("/cdn/blob", &fileServer{body: body, ranges: true})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	s := Store{t.TempDir()}
	url := srv.URL + "/user/repo/resolve/main/model-Q4_K_M.gguf"
	if _, err := s.Pull(context.Background(), url, PullOptions{}); err == nil || !strings.Contains(err.Error(), published) {
		t.Fatalf("%v", err)
	}
	published = sum(body)
	if _, err := s.Pull(context.Background(), url, PullOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestAFileThatChangesMidDownloadStartsOver(t *testing.T) {
	v1, v2 := testFile(), testFile()
	for i := range v2 {
		v2[i] ^= 0x5A
	}
	copy(v2, "GGUF")
	var mu sync.Mutex
	served := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		served++
		first := served == 1
		mu.Unlock()
		if first {
			// Version 1, dropped halfway.
			w.Header().Set("ETag", `"v1"`)
			w.Header().Set("Content-Length", strconv.Itoa(len(v1)))
			w.Write(v1[:len(v1)/2])
			w.(http.Flusher).Flush()
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
			return
		}
		// Version 2 from then on, ranges honoured, If-Range ignored.
		(&fileServer{body: v2, ranges: true}).serveTagged(w, r, `"v2"`)
	}))
	defer srv.Close()
	s := Store{t.TempDir()}
	path, err := s.Pull(context.Background(), srv.URL+"/m/model.gguf", PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(path)
	if sum(got) != sum(v2) {
		t.Fatal("the file mixes two versions")
	}
}
