package main

import (
	"bufio"
	"bytes"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The m40 program, built once for these tests.
func binary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "m40")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func gemmaPath(t *testing.T) string {
	path := os.Getenv("M40_GEMMA_GGUF")
	if path == "" {
		t.Skip("M40_GEMMA_GGUF is not set")
	}
	return path
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startServe runs `m40 serve` on the model and waits until it answers.
func startServe(t *testing.T, bin, model string, extra ...string) (*exec.Cmd, string, *bytes.Buffer) {
	t.Helper()
	addr := freeAddr(t)
	args := append([]string{"serve", "-m", model, "-device", "-1", "-threads", "2", "-ctx", "1024", "-addr", addr}, extra...)
	cmd := exec.Command(bin, args...)
	var logs bytes.Buffer
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return cmd, "http://" + addr, &logs
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("m40 serve did not start: %s", logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestSIGTERMEndsStreamsWithAnErrorAndDone(t *testing.T) {
	model := gemmaPath(t)
	cmd, url, logs := startServe(t, binary(t), model)
	resp, err := http.Post(url+"/v1/completions", "application/json",
		strings.NewReader(`{"prompt": "Once upon a time", "max_tokens": 900, "temperature": 0, "stream": true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	reader := bufio.NewReader(resp.Body)
	if line, _ := reader.ReadString('\n'); !strings.HasPrefix(line, "data: ") {
		t.Fatalf("%q", line)
	}
	start := time.Now()
	cmd.Process.Signal(syscall.SIGTERM)
	var sawError, sawDone bool
	for {
		line, err := reader.ReadString('\n')
		if err != nil {
			break
		}
		sawError = sawError || strings.HasPrefix(line, `data: {"error"`)
		sawDone = sawDone || line == "data: [DONE]\n"
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit: %v\n%s", err, logs)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("still running 15 s after SIGTERM\n%s", logs)
	}
	if !sawError || !sawDone {
		t.Fatalf("error event %v, [DONE] %v after %v\n%s", sawError, sawDone, time.Since(start), logs)
	}
	// New connections are refused once it has stopped.
	if _, err := http.Get(url + "/health"); err == nil {
		t.Fatal("still accepting")
	}
	// One log line per request: method, path, status, tokens, time.
	if !strings.Contains(logs.String(), "POST /v1/completions 200 prompt=5") {
		t.Fatalf("%s", logs)
	}
}

// The official `openai` Python client against `m40 serve`
// (tests/openai_client.py; $M40_PYTHON is a Python with the package).
func TestTheOpenAIClient(t *testing.T) {
	model := gemmaPath(t)
	python := os.Getenv("M40_PYTHON")
	if python == "" {
		t.Skip("M40_PYTHON (a Python with the openai package) is not set")
	}
	_, url, logs := startServe(t, binary(t), model, "-api-key", "sesame", "-name", "gemma")
	script, _ := filepath.Abs("../../../../tests/openai_client.py")
	out, err := exec.Command(python, script, url+"/v1", "sesame", "gemma").CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s\nserver:\n%s", err, out, logs)
	}
	t.Logf("%s", out)
}

func TestTheStoreCommands(t *testing.T) {
	model := gemmaPath(t)
	bin := binary(t)
	store := t.TempDir()
	env := append(os.Environ(), "M40_MODELS="+store)
	srv := &http.Server{Handler: http.FileServer(http.Dir(filepath.Dir(model)))}
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(l)
	defer srv.Close()
	m40 := func(args ...string) string {
		cmd := exec.Command(bin, args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("m40 %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	m40("pull", "-q", "-name", "gemma", "http://"+l.Addr().String()+"/"+filepath.Base(model))
	listing := m40("list")
	if !strings.Contains(listing, "gemma ") || !strings.Contains(listing, "gemma3") || !strings.Contains(listing, "32768") {
		t.Fatalf("%s", listing)
	}
	shown := m40("show", "gemma")
	if !strings.Contains(shown, `"chat_template":"gemma"`) || !strings.Contains(shown, "general.architecture = gemma3") {
		t.Fatalf("%s", shown)
	}
	reply := m40("run", "gemma", "Say hello.", "-n", "8", "-temp", "0", "-device", "-1")
	if strings.TrimSpace(reply) == "" {
		t.Fatal("no reply")
	}
	// Interactive: two turns on standard input, history kept.
	cmd := exec.Command(bin, "run", "gemma", "-n", "8", "-temp", "0", "-device", "-1")
	cmd.Env = env
	cmd.Stdin = strings.NewReader("Hi\nAnd again?\n")
	out, err := cmd.CombinedOutput()
	if err != nil || strings.Count(string(out), "\n") < 2 {
		t.Fatalf("%v\n%s", err, out)
	}
	m40("rm", "gemma")
	if strings.Contains(m40("list"), "gemma ") {
		t.Fatal("still listed")
	}
}
