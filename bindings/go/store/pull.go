package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// PullOptions tune Pull; the zero value works.
type PullOptions struct {
	SHA256   string       // the expected sha256 (hex); else the source's, where it publishes one
	Name     string       // the model's name in the store; else from the file's name
	Endpoint string       // Hugging Face's address; else $MODEL_ENDPOINT, $HF_ENDPOINT, https://huggingface.co/
	Token    string       // a Hugging Face token; else $HF_TOKEN
	Progress io.Writer    // progress lines (carriage-return updated); nil: none
	Client   *http.Client // nil: a client with connection timeouts
	Retries  int          // attempts after a dropped connection or a server error; 0: 5, negative: none
}

// source is a file to download.
type source struct {
	url    string
	name   string // the model's name
	sha256 string // published checksum, if any
}

// Pull downloads a model into the store and returns its path. ref is an
// http(s) URL of a GGUF file, or a Hugging Face repository as llama.cpp's
// -hf takes it: user/repo[:QUANT] (also prefixed hf.co/ or
// huggingface.co/), the file chosen as llama.cpp chooses it. An interrupted
// download resumes where it stopped (HTTP Range), in this call after a
// dropped connection, or in the next call; the file enters the store, by
// an atomic rename, only once complete and its sha256 checked.
func (s Store) Pull(ctx context.Context, ref string, opt PullOptions) (string, error) {
	if opt.Client == nil {
		opt.Client = &http.Client{Transport: &http.Transport{
			Proxy: http.ProxyFromEnvironment, ResponseHeaderTimeout: 60 * time.Second,
			TLSHandshakeTimeout: 30 * time.Second, IdleConnTimeout: 90 * time.Second,
		}}
	}
	if opt.Retries == 0 {
		opt.Retries = 5
	}
	if opt.Token == "" {
		opt.Token = os.Getenv("HF_TOKEN")
	}
	if opt.Endpoint == "" {
		opt.Endpoint = os.Getenv("MODEL_ENDPOINT")
	}
	if opt.Endpoint == "" {
		opt.Endpoint = os.Getenv("HF_ENDPOINT")
	}
	if opt.Endpoint == "" {
		opt.Endpoint = "https://huggingface.co/"
	}
	if !strings.HasSuffix(opt.Endpoint, "/") {
		opt.Endpoint += "/"
	}
	var src source
	var err error
	if strings.HasPrefix(ref, "https://") || strings.HasPrefix(ref, "http://") {
		src, err = urlSource(ref)
	} else {
		src, err = hfSource(ctx, ref, opt)
	}
	if err != nil {
		return "", err
	}
	if opt.Name != "" {
		src.name = opt.Name
	}
	if src.name, _, err = s.modelPath(src.name); err != nil {
		return "", err
	}
	if opt.SHA256 != "" {
		if !isSHA256(opt.SHA256) {
			return "", fmt.Errorf("%q is not a sha256 (64 hex digits)", opt.SHA256)
		}
		src.sha256 = strings.ToLower(opt.SHA256)
	}
	return s.download(ctx, src, opt)
}

var sha256Hex = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)

func isSHA256(s string) bool { return sha256Hex.MatchString(s) }

func urlSource(ref string) (source, error) {
	u, err := url.Parse(ref)
	if err != nil {
		return source{}, err
	}
	base := path.Base(u.Path)
	if !strings.HasSuffix(strings.ToLower(base), ".gguf") {
		return source{}, fmt.Errorf("%s does not name a .gguf file (give the model a name with -name)", ref)
	}
	return source{url: ref, name: base[:len(base)-len(".gguf")]}, nil
}

// hfFile is an entry of a Hugging Face repository's file tree.
type hfFile struct {
	Type string `json:"type"`
	Path string `json:"path"`
	LFS  *struct {
		Oid string `json:"oid"`
	} `json:"lfs"`
}

var (
	repoID   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$`)
	commitID = regexp.MustCompile(`^[0-9a-f]{40}$`)
	splitRe  = regexp.MustCompile(`-\d{5}-of-\d{5}\.gguf$`)
)

// hfSource resolves user/repo[:QUANT] as llama.cpp 0c1e57098 does: the
// main branch's commit (api/models/REPO/refs), its files
// (api/models/REPO/tree/COMMIT?recursive=true), and the first model file
// whose name holds the quantization followed by "." or "-" (any case;
// Q4_K_M, then Q8_0, then any model file when none is given).
func hfSource(ctx context.Context, ref string, opt PullOptions) (source, error) {
	ref = strings.TrimPrefix(strings.TrimPrefix(ref, "hf.co/"), "huggingface.co/")
	repo, tag := ref, ""
	if i := strings.LastIndexByte(ref, ':'); i >= 0 {
		repo, tag = ref[:i], ref[i+1:]
	}
	if !repoID.MatchString(repo) || strings.Contains(repo, "..") {
		return source{}, fmt.Errorf("%q is neither an http(s) URL nor a Hugging Face repository (user/repo[:QUANT])", ref)
	}
	if tag != "" && !regexp.MustCompile(`^[A-Za-z0-9_.-]+$`).MatchString(tag) {
		return source{}, fmt.Errorf("%q is not a quantization tag", tag)
	}
	var refs struct {
		Branches []struct {
			Name         string `json:"name"`
			TargetCommit string `json:"targetCommit"`
		} `json:"branches"`
	}
	if err := getJSON(ctx, opt, opt.Endpoint+"api/models/"+repo+"/refs", &refs); err != nil {
		return source{}, err
	}
	commit := ""
	for _, b := range refs.Branches {
		if !commitID.MatchString(b.TargetCommit) {
			continue
		}
		if b.Name == "main" {
			commit = b.TargetCommit
			break
		}
		if commit == "" {
			commit = b.TargetCommit
		}
	}
	if commit == "" {
		return source{}, fmt.Errorf("%s has no branch to download from", repo)
	}
	var files []hfFile
	if err := getJSON(ctx, opt, opt.Endpoint+"api/models/"+repo+"/tree/"+commit+"?recursive=true", &files); err != nil {
		return source{}, err
	}
	isModel := func(p string) bool {
		base := path.Base(p)
		if !strings.HasSuffix(p, ".gguf") || strings.Contains(p, "..") {
			return false
		}
		for _, not := range []string{"mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-"} {
			if strings.Contains(base, not) {
				return false
			}
		}
		return true
	}
	tags := []string{tag}
	if tag == "" {
		tags = []string{"Q4_K_M", "Q8_0", ""}
	}
	var chosen *hfFile
	for _, t := range tags {
		pattern := regexp.MustCompile("(?i)" + regexp.QuoteMeta(t) + "[.-]")
		for i := range files {
			f := &files[i]
			if f.Type == "file" && isModel(f.Path) && (t == "" || pattern.MatchString(f.Path)) {
				if splitRe.MatchString(f.Path) && !strings.Contains(f.Path, "-00001-of-") {
					continue
				}
				chosen = f
				break
			}
		}
		if chosen != nil {
			break
		}
	}
	if chosen == nil {
		var names []string
		for _, f := range files {
			if strings.HasSuffix(f.Path, ".gguf") {
				names = append(names, f.Path)
			}
		}
		return source{}, fmt.Errorf("%s has no GGUF model file for %q; it has: %s", repo, tag, strings.Join(names, ", "))
	}
	if splitRe.MatchString(chosen.Path) {
		return source{}, fmt.Errorf("%s is split into several files, which m40 does not load", chosen.Path)
	}
	segments := strings.Split(chosen.Path, "/")
	for i := range segments {
		segments[i] = url.PathEscape(segments[i])
	}
	src := source{
		url:  opt.Endpoint + repo + "/resolve/" + commit + "/" + strings.Join(segments, "/"),
		name: strings.TrimSuffix(path.Base(chosen.Path), ".gguf"),
	}
	if chosen.LFS != nil && isSHA256(chosen.LFS.Oid) {
		src.sha256 = strings.ToLower(chosen.LFS.Oid)
	}
	return src, nil
}

func getJSON(ctx context.Context, opt PullOptions, u string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "m40")
	if opt.Token != "" {
		req.Header.Set("Authorization", "Bearer "+opt.Token)
	}
	resp, err := opt.Client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("GET %s: %s %s", u, resp.Status, strings.TrimSpace(string(body)))
	}
	return json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(v)
}

// partialState is kept beside a download in progress, so that the next
// attempt resumes only the same file (same URL and validator).
type partialState struct {
	URL  string `json:"url"`
	ETag string `json:"etag"`
}

// download fetches src into the store's .partial folder, resuming what is
// there, then checks it and renames it into the store.
func (s Store) download(ctx context.Context, src source, opt PullOptions) (string, error) {
	partialDir := filepath.Join(s.Dir, ".partial")
	if err := os.MkdirAll(partialDir, 0o755); err != nil {
		return "", err
	}
	_, final, _ := s.modelPath(src.name)
	partial := filepath.Join(partialDir, src.name+".gguf.partial")
	statePath := partial + ".json"

	var state partialState
	if b, err := os.ReadFile(statePath); err == nil {
		json.Unmarshal(b, &state)
	}
	if state.URL != src.url {
		state = partialState{URL: src.url}
		os.Remove(partial)
	}
	f, err := os.OpenFile(partial, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return "", err
	}
	defer f.Close()
	// One pull of a model at a time: a second would write the same file.
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return "", fmt.Errorf("another m40 pull is downloading %s (%v)", src.name, err)
	}
	// The hash of what is already there, continued as bytes arrive.
	h := sha256.New()
	offset, err := io.Copy(h, f)
	if err != nil {
		return "", err
	}
	d := &downloader{opt: opt, src: src, f: f, h: h, offset: offset, state: &state, statePath: statePath}
	if err := d.run(ctx); err != nil {
		return "", err
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if d.published != "" && src.sha256 == "" {
		src.sha256 = d.published
	}
	discard := func(err error) (string, error) {
		f.Close()
		os.Remove(partial)
		os.Remove(statePath)
		return "", err
	}
	if src.sha256 != "" && sum != src.sha256 {
		return discard(fmt.Errorf("%s: sha256 %s, but the source says %s: the download was removed", src.url, sum, src.sha256))
	}
	var magic [4]byte
	if _, err := f.ReadAt(magic[:], 0); err != nil || string(magic[:]) != "GGUF" {
		return discard(fmt.Errorf("%s is not a GGUF file: the download was removed", src.url))
	}
	if err := f.Sync(); err != nil {
		return "", err
	}
	if err := os.Rename(partial, final); err != nil {
		return "", err
	}
	os.Remove(statePath)
	if opt.Progress != nil {
		check := "no published sha256 to check"
		if src.sha256 != "" {
			check = "sha256 " + sum + " verified"
		}
		fmt.Fprintf(opt.Progress, "%s: %d bytes, %s\n", final, d.offset, check)
	}
	return final, nil
}

type downloader struct {
	opt       PullOptions
	src       source
	f         *os.File
	h         hash.Hash
	offset    int64
	total     int64 // -1: unknown
	published string
	state     *partialState
	statePath string
	lastShown time.Time
	started   time.Time
	startedAt int64
}

// errRetry marks failures worth another attempt.
type errRetry struct{ err error }

func (e errRetry) Error() string { return e.err.Error() }

func (d *downloader) run(ctx context.Context) error {
	d.started, d.startedAt, d.total = time.Now(), d.offset, -1
	var last error
	retries := d.opt.Retries
	if retries < 0 {
		retries = 0
	}
	for attempt := 0; attempt <= retries; attempt++ {
		if attempt > 0 {
			select {
			case <-time.After(time.Duration(attempt) * 250 * time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		done, err := d.attempt(ctx)
		if done {
			return nil
		}
		var retry errRetry
		if !errors.As(err, &retry) || ctx.Err() != nil {
			return err
		}
		last = retry.err
		if d.opt.Progress != nil {
			fmt.Fprintf(d.opt.Progress, "\n%s: %v; resuming at byte %d\n", d.src.name, retry.err, d.offset)
		}
	}
	return fmt.Errorf("%s: gave up after %d attempts: %v (what arrived is kept; pull again to resume)", d.src.url, retries+1, last)
}

// startOver drops what arrived and has the next attempt begin at byte 0,
// for `reason`.
func (d *downloader) startOver(reason error) (bool, error) {
	if err := d.restart(); err != nil {
		return false, err
	}
	return false, errRetry{reason}
}

// restart drops what arrived: the server sent the whole file again.
func (d *downloader) restart() error {
	if err := d.f.Truncate(0); err != nil {
		return err
	}
	if _, err := d.f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	d.h.Reset()
	d.offset, d.startedAt = 0, 0
	return nil
}

// attempt makes one request, from the current offset; done when the file
// is complete.
func (d *downloader) attempt(ctx context.Context) (bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.src.url, nil)
	if err != nil {
		return false, err
	}
	req.Header.Set("User-Agent", "m40")
	if d.opt.Token != "" && strings.HasPrefix(d.src.url, d.opt.Endpoint) {
		req.Header.Set("Authorization", "Bearer "+d.opt.Token)
	}
	if d.offset > 0 {
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", d.offset))
		if d.state.ETag != "" {
			req.Header.Set("If-Range", d.state.ETag)
		}
	}
	// Hugging Face publishes the sha256 on its redirect to the file's
	// store (X-Linked-Etag), not on the file's response: look at every hop.
	client := *d.opt.Client
	client.CheckRedirect = func(next *http.Request, via []*http.Request) error {
		if next.Response != nil {
			d.notePublished(next.Response.Header)
		}
		if d.opt.Client.CheckRedirect != nil {
			return d.opt.Client.CheckRedirect(next, via)
		}
		if len(via) >= 10 {
			return errors.New("stopped after 10 redirects")
		}
		return nil
	}
	resp, err := client.Do(req)
	if err != nil {
		return false, errRetry{err}
	}
	defer resp.Body.Close()
	d.notePublished(resp.Header)
	switch {
	case resp.StatusCode == http.StatusPartialContent:
		start, total, ok := contentRange(resp.Header.Get("Content-Range"))
		if etag := resp.Header.Get("ETag"); d.state.ETag != "" && etag != "" && etag != d.state.ETag {
			// The file changed and the server ignored If-Range.
			d.state.ETag = etag
			return d.startOver(errors.New("the file changed on the server: starting over"))
		}
		if !ok || start != d.offset {
			return d.startOver(fmt.Errorf("the server resumed at the wrong place (%q)", resp.Header.Get("Content-Range")))
		}
		d.total = total
	case resp.StatusCode == http.StatusOK:
		if d.offset > 0 {
			// No Range support, or the file changed (If-Range): start over.
			if err := d.restart(); err != nil {
				return false, err
			}
		}
		d.total = resp.ContentLength
	case resp.StatusCode == http.StatusRequestedRangeNotSatisfiable:
		if _, total, ok := contentRange(resp.Header.Get("Content-Range")); ok && total == d.offset {
			return true, nil
		}
		return d.startOver(errors.New("the server refused the range: starting over"))
	case resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests:
		return false, errRetry{fmt.Errorf("GET %s: %s", d.src.url, resp.Status)}
	default:
		return false, fmt.Errorf("GET %s: %s", d.src.url, resp.Status)
	}
	if etag := resp.Header.Get("ETag"); etag != "" {
		d.state.ETag = etag
	}
	if b, err := json.Marshal(d.state); err == nil {
		os.WriteFile(d.statePath, b, 0o644)
	}
	buf := make([]byte, 1<<20)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := d.f.Write(buf[:n]); werr != nil {
				return false, werr
			}
			d.h.Write(buf[:n])
			d.offset += int64(n)
			d.show(false)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return false, errRetry{err}
		}
	}
	d.show(true)
	if d.total >= 0 && d.offset != d.total {
		return false, errRetry{fmt.Errorf("the connection ended at byte %d of %d", d.offset, d.total)}
	}
	return true, nil
}

// notePublished keeps a sha256 the headers publish (X-Linked-Etag, or an
// ETag that is one).
func (d *downloader) notePublished(h http.Header) {
	if v := strings.Trim(h.Get("X-Linked-Etag"), `"`); isSHA256(v) {
		d.published = strings.ToLower(v)
	} else if v := strings.Trim(h.Get("ETag"), `"`); isSHA256(v) && d.published == "" {
		d.published = strings.ToLower(v)
	}
}

// contentRange parses "bytes START-END/TOTAL" (or "bytes */TOTAL").
func contentRange(v string) (start, total int64, ok bool) {
	v = strings.TrimPrefix(v, "bytes ")
	slash := strings.IndexByte(v, '/')
	if slash < 0 {
		return 0, 0, false
	}
	total, err := strconv.ParseInt(v[slash+1:], 10, 64)
	if err != nil {
		return 0, 0, false
	}
	if v[:slash] == "*" {
		return 0, total, true
	}
	dash := strings.IndexByte(v[:slash], '-')
	if dash < 0 {
		return 0, 0, false
	}
	start, err = strconv.ParseInt(v[:dash], 10, 64)
	return start, total, err == nil
}

// show prints progress at most ten times a second (and at the end).
func (d *downloader) show(final bool) {
	if d.opt.Progress == nil || (!final && time.Since(d.lastShown) < 100*time.Millisecond) {
		return
	}
	d.lastShown = time.Now()
	rate := float64(d.offset-d.startedAt) / time.Since(d.started).Seconds() / 1e6
	if d.total > 0 {
		width := 30
		filled := int(float64(width) * float64(d.offset) / float64(d.total))
		if filled > width {
			filled = width
		}
		fmt.Fprintf(d.opt.Progress, "\r%s [%s%s] %5.1f%% %.1f/%.1f MB %.1f MB/s ", d.src.name,
			strings.Repeat("#", filled), strings.Repeat(".", width-filled),
			100*float64(d.offset)/float64(d.total), float64(d.offset)/1e6, float64(d.total)/1e6, rate)
	} else {
		fmt.Fprintf(d.opt.Progress, "\r%s %.1f MB %.1f MB/s ", d.src.name, float64(d.offset)/1e6, rate)
	}
	if final {
		fmt.Fprintln(d.opt.Progress)
	}
}
