// m40: pull, list, show, remove, run and serve GGUF models with libm40llm.
//
//	m40 pull URL|user/repo[:QUANT] [-sha256 HEX] [-name NAME]
//	m40 list
//	m40 show NAME [-template]
//	m40 rm NAME...
//	m40 run NAME [PROMPT] [-n N] [-temp T] [-seed S] [-system TEXT] [model flags]
//	m40 serve NAME [-addr 127.0.0.1:8080] [server flags] [model flags]
//
// Models live in $M40_MODELS (default $XDG_DATA_HOME/m40/models, else
// ~/.local/share/m40/models); NAME is a model there, or a path to a GGUF file.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	m40 "m40llm/bindings/go"
	"m40llm/bindings/go/server"
	"m40llm/bindings/go/store"
)

const usage = `m40: pull, list, show, remove, run and serve GGUF models.

  m40 pull URL|user/repo[:QUANT]   download a model (resumes; checks sha256)
  m40 list                         the models in the store
  m40 show NAME                    a model's metadata and chat template
  m40 rm NAME...                   delete models
  m40 run NAME [PROMPT]            generate a reply, or chat when no prompt is given
  m40 serve NAME                   an OpenAI-style HTTP server

The store is $M40_MODELS (default $XDG_DATA_HOME/m40/models). NAME is a model
in it or a path to a GGUF file. 'm40 COMMAND -h' lists a command's flags.
run and serve split a model's layers over several devices with -devices 0,1
(two GPUs) or -devices -1,0 (CPU, then GPU: partial offload), -split 3,1
setting each one's share.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	commands := map[string]func([]string) error{
		"pull": pull, "list": list, "ls": list, "show": show, "rm": remove,
		"run": run, "serve": serve,
	}
	command, ok := commands[os.Args[1]]
	if !ok {
		if os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
			fmt.Print(usage)
			return
		}
		fmt.Fprintf(os.Stderr, "m40: unknown command %q\n\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if err := command(os.Args[2:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintf(os.Stderr, "m40 %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

// parse reads flags placed before or after the positional arguments.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return positional, nil
		}
		positional = append(positional, args[0])
		args = args[1:]
	}
}

func openStore() (store.Store, error) { return store.Default() }

func pull(args []string) error {
	fs := flag.NewFlagSet("pull", flag.ContinueOnError)
	sum := fs.String("sha256", "", "the expected sha256 (else the source's, where it publishes one)")
	name := fs.String("name", "", "the model's name in the store (else the file's name)")
	quiet := fs.Bool("q", false, "no progress bar")
	refs, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(refs) != 1 {
		return errors.New("give one URL or user/repo[:QUANT]")
	}
	s, err := openStore()
	if err != nil {
		return err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	opt := store.PullOptions{SHA256: *sum, Name: *name}
	if !*quiet {
		opt.Progress = os.Stderr
	}
	path, err := s.Pull(ctx, refs[0], opt)
	if err != nil {
		return err
	}
	fmt.Println(path)
	return nil
}

func list(args []string) error {
	fs := flag.NewFlagSet("list", flag.ContinueOnError)
	if rest, err := parse(fs, args); err != nil || len(rest) > 0 {
		if err == nil {
			err = errors.New("list takes no arguments")
		}
		return err
	}
	s, err := openStore()
	if err != nil {
		return err
	}
	entries, err := s.List()
	if err != nil {
		return err
	}
	w := bufio.NewWriter(os.Stdout)
	defer w.Flush()
	fmt.Fprintf(w, "%-40s %-10s %8s %9s %8s  %s\n", "NAME", "ARCH", "PARAMS", "SIZE", "CONTEXT", "TYPES")
	for _, e := range entries {
		info, err := store.ReadInfo(e.Path)
		if err != nil {
			fmt.Fprintf(w, "%-40s (unreadable: %v)\n", e.Name, err)
			continue
		}
		fmt.Fprintf(w, "%-40s %-10s %8s %9s %8d  %s\n", e.Name, info.Architecture,
			count(info.Parameters), bytesText(e.Size), info.ContextLength, info.TypeMix())
	}
	return nil
}

func count(n uint64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.1fB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.0fM", float64(n)/1e6)
	}
	return fmt.Sprintf("%.0fK", float64(n)/1e3)
}

func bytesText(n int64) string {
	if n >= 1<<30 {
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	}
	return fmt.Sprintf("%.0f MiB", float64(n)/(1<<20))
}

func show(args []string) error {
	fs := flag.NewFlagSet("show", flag.ContinueOnError)
	template := fs.Bool("template", false, "print only the chat template")
	names, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(names) != 1 {
		return errors.New("give one model")
	}
	s, err := openStore()
	if err != nil {
		return err
	}
	path, err := s.Find(names[0])
	if err != nil {
		return err
	}
	info, err := store.ReadInfo(path)
	if err != nil {
		return err
	}
	if *template {
		fmt.Println(info.ChatTemplate)
		return nil
	}
	fmt.Printf("path          %s\narchitecture  %s\nname          %s\nparameters    %s (%d tensors)\ncontext       %d\ntypes         %s\n",
		path, info.Architecture, info.Name, count(info.Parameters), info.Tensors, info.ContextLength, info.TypeMix())
	// The chat format the library recognizes, from a vocabulary-only load.
	if model, err := m40.LoadVocab(path); err == nil {
		if desc, err := model.Describe(); err == nil {
			fmt.Printf("description   %s\n", desc)
		}
		model.Close()
	}
	fmt.Println("\nmetadata")
	for _, kv := range info.Metadata {
		if kv.Key != "tokenizer.chat_template" {
			fmt.Printf("  %s = %s\n", kv.Key, kv.Value)
		}
	}
	if info.ChatTemplate != "" {
		fmt.Printf("\nchat template (tokenizer.chat_template)\n%s\n", info.ChatTemplate)
	}
	return nil
}

func remove(args []string) error {
	fs := flag.NewFlagSet("rm", flag.ContinueOnError)
	names, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(names) == 0 {
		return errors.New("give the models to remove")
	}
	s, err := openStore()
	if err != nil {
		return err
	}
	for _, name := range names {
		if err := s.Remove(name); err != nil {
			return err
		}
		fmt.Printf("removed %s\n", name)
	}
	return nil
}

// modelFlags are the flags that choose where a model runs.
type modelFlags struct {
	device, threads *int
	devices, split  *string
}

func addModelFlags(fs *flag.FlagSet) modelFlags {
	return modelFlags{
		device:  fs.Int("device", m40.DefaultModelParams().Device, "-1: CPU, 0..: CUDA device"),
		threads: fs.Int("threads", 0, "CPU threads (0: one per core)"),
		devices: fs.String("devices", "", "split the layers over these devices in order, e.g. 0,1 (two GPUs) or -1,0 (CPU, then GPU 0: partial offload)"),
		split:   fs.String("split", "", "each of -devices' share of the layers, e.g. 3,1 (default: from free memory)"),
	}
}

// params are the flags' model parameters.
func (mf modelFlags) params() (m40.ModelParams, error) {
	p := m40.ModelParams{Device: *mf.device, Threads: *mf.threads}
	if *mf.devices == "" {
		if *mf.split != "" {
			return p, fmt.Errorf("-split needs -devices")
		}
		return p, nil
	}
	var shares []string
	if *mf.split != "" {
		shares = strings.Split(*mf.split, ",")
	}
	devices := strings.Split(*mf.devices, ",")
	if shares != nil && len(shares) != len(devices) {
		return p, fmt.Errorf("-split has %d shares for %d devices", len(shares), len(devices))
	}
	for i, d := range devices {
		device, err := strconv.Atoi(strings.TrimSpace(d))
		if err != nil {
			return p, fmt.Errorf("-devices: %q is not a device index", d)
		}
		share := autoShare
		if shares != nil {
			v, err := strconv.ParseFloat(strings.TrimSpace(shares[i]), 32)
			if err != nil {
				return p, fmt.Errorf("-split: %q is not a number", shares[i])
			}
			share = float32(v)
		}
		p.Split = append(p.Split, m40.DeviceShare{Device: device, Share: share})
	}
	return p, nil
}

// autoShare leaves a device's share of the layers to free memory.
const autoShare float32 = 0

// loadModel loads a model of the store by name (or a GGUF file by a path
// with a folder in it), or, with direct, the file at path as it is.
func loadModel(path string, direct bool, mf modelFlags) (*m40.Model, string, error) {
	if !direct {
		s, err := openStore()
		if err != nil {
			return nil, "", err
		}
		if path, err = s.Find(path); err != nil {
			return nil, "", err
		}
	}
	params, err := mf.params()
	if err != nil {
		return nil, "", err
	}
	model, err := m40.Load(path, params)
	return model, path, err
}

func run(args []string) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	mf := addModelFlags(fs)
	n := fs.Int("n", 512, "most tokens a reply generates")
	temp := fs.Float64("temp", float64(m40.DefaultSampler().Temperature), "temperature (0: greedy)")
	seed := fs.Uint64("seed", 0, "sampling seed (0: from the clock)")
	system := fs.String("system", "", "a system message opening the conversation")
	nCtx := fs.Int("ctx", 4096, "context tokens")
	rest, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(rest) < 1 || len(rest) > 2 {
		return errors.New("give a model and, for one reply, a prompt")
	}
	if *n < 1 || *nCtx < 1 {
		return errors.New("-n and -ctx must be at least 1")
	}
	model, _, err := loadModel(rest[0], false, mf)
	if err != nil {
		return err
	}
	defer model.Close()
	session, err := model.NewSession(*nCtx)
	if err != nil {
		return err
	}
	defer session.Close()
	sampler := m40.DefaultSampler()
	sampler.Temperature = float32(*temp)
	sampler.Seed = *seed
	if *seed == 0 {
		sampler.Seed = uint64(time.Now().UnixNano())
	}
	c := &chat{model: model, session: session, sampler: sampler, maxTokens: *n}
	if *system != "" {
		c.messages = append(c.messages, m40.ChatMessage{Role: "system", Content: *system})
	}
	if len(rest) == 2 {
		_, err := c.reply(rest[1], os.Stdout)
		fmt.Println()
		return err
	}
	interactive := isTerminal(os.Stdin)
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<16), 16<<20)
	for {
		if interactive {
			fmt.Fprint(os.Stderr, ">>> ")
		}
		if !in.Scan() {
			return in.Err()
		}
		line := strings.TrimSpace(in.Text())
		if line == "" {
			continue
		}
		if line == "/bye" || line == "/exit" {
			return nil
		}
		if _, err := c.reply(line, os.Stdout); err != nil {
			if !m40.IsStatus(err, m40.ContextFull) {
				return err
			}
			fmt.Fprintln(os.Stderr, "\n(the context is full: the conversation starts over)")
			c.restart()
			continue
		}
		fmt.Println()
	}
}

func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// chat is a conversation kept in one session: each turn decodes only what
// its tokens add to those the session holds.
type chat struct {
	model     *m40.Model
	session   *m40.Session
	sampler   m40.SamplerParams
	maxTokens int
	messages  []m40.ChatMessage
	held      []m40.Token // the session's tokens
}

func (c *chat) restart() {
	c.session.Reset()
	c.held = nil
	system := c.messages[:0]
	if len(c.messages) > 0 && c.messages[0].Role == "system" {
		system = c.messages[:1]
	}
	c.messages = system
}

// reply adds a user message, generates the reply to out and keeps it.
func (c *chat) reply(text string, out io.Writer) (string, error) {
	c.messages = append(c.messages, m40.ChatMessage{Role: "user", Content: text})
	tokens, err := c.model.ChatTokenize(c.messages, true)
	if err != nil {
		c.messages = c.messages[:len(c.messages)-1]
		return "", err
	}
	shared := 0
	for shared < len(c.held) && shared < len(tokens)-1 && c.held[shared] == tokens[shared] {
		shared++
	}
	if err := c.session.Truncate(shared); err != nil {
		return "", err
	}
	if err := c.session.Decode(tokens[shared:]); err != nil {
		c.session.Truncate(shared)
		c.held = c.held[:shared]
		c.messages = c.messages[:len(c.messages)-1]
		return "", err
	}
	c.held = append(c.held[:shared], tokens[shared:]...)
	var reply []byte
	sent := 0
	for i := 0; i < c.maxTokens; i++ {
		t, err := c.session.Sample(c.sampler)
		if err != nil {
			return "", err
		}
		if c.model.IsEndOfGeneration(t) {
			break
		}
		piece, err := c.model.TokenPiece(t)
		if err != nil {
			return "", err
		}
		reply = append(reply, piece...)
		// Whole characters only.
		if end := m40.CompleteUTF8(reply); end > sent {
			out.Write(reply[sent:end])
			sent = end
		}
		if err := c.session.Decode([]m40.Token{t}); err != nil {
			return "", err
		}
		c.held = append(c.held, t)
	}
	out.Write(reply[sent:])
	c.messages = append(c.messages, m40.ChatMessage{Role: "assistant", Content: string(reply)})
	return string(reply), nil
}

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	mf := addModelFlags(fs)
	cfg := server.DefaultConfig()
	addr := fs.String("addr", "127.0.0.1:8080", "listen address")
	path := fs.String("m", "", "a GGUF file (instead of NAME)")
	name := fs.String("name", "", "the model's id in the API (default: its name)")
	fs.IntVar(&cfg.NCtx, "ctx", cfg.NCtx, "context tokens of a session")
	fs.IntVar(&cfg.Sessions, "sessions", cfg.Sessions, "sessions kept: requests generating at once")
	fs.IntVar(&cfg.QueueLimit, "queue", cfg.QueueLimit, "requests that may wait for a session (more get 429)")
	fs.IntVar(&cfg.DefaultMaxTokens, "max-tokens", cfg.DefaultMaxTokens, "a chat reply's max_tokens when the request gives none")
	fs.Int64Var(&cfg.MaxBodyBytes, "max-body", cfg.MaxBodyBytes, "largest request body, bytes (more get 413)")
	fs.IntVar(&cfg.MaxChoices, "max-n", cfg.MaxChoices, "largest n (choices) a request may ask for")
	fs.IntVar(&cfg.PromptChunk, "prompt-chunk", 0, "prompt tokens decoded between decode steps (0: as many as take one step)")
	fs.DurationVar(&cfg.HeaderTimeout, "header-timeout", cfg.HeaderTimeout, "time to read a request's headers")
	fs.DurationVar(&cfg.ReadTimeout, "read-timeout", cfg.ReadTimeout, "time to read a whole request")
	fs.DurationVar(&cfg.IdleTimeout, "idle-timeout", cfg.IdleTimeout, "time an idle keep-alive connection stays open")
	fs.DurationVar(&cfg.WriteTimeout, "write-timeout", cfg.WriteTimeout, "time a write to a client may take")
	apiKey := fs.String("api-key", "", "require \"Authorization: Bearer KEY\" (default: $M40_API_KEY; none when empty)")
	quiet := fs.Bool("quiet", false, "no request log")
	rest, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(rest)+len(*path) == 0 || len(rest) > 1 || (len(rest) == 1 && *path != "") {
		return errors.New("give one model (NAME or -m FILE)")
	}
	target := *path
	if target == "" {
		target = rest[0]
	}
	cfg.APIKey = *apiKey
	if cfg.APIKey == "" {
		cfg.APIKey = os.Getenv("M40_API_KEY")
	}
	model, file, err := loadModel(target, *path != "", mf)
	if err != nil {
		return err
	}
	defer model.Close()
	cfg.Name = *name
	if cfg.Name == "" {
		cfg.Name = strings.TrimSuffix(fileBase(file), ".gguf")
	}
	if fi, err := os.Stat(file); err == nil {
		cfg.Created = fi.ModTime().Unix()
	}
	logger := log.New(os.Stderr, "m40 serve: ", log.LstdFlags)
	if !*quiet {
		cfg.Log = logger
	}
	srv, err := server.New(model, cfg)
	if err != nil {
		return err
	}
	hs := srv.HTTPServer(*addr)
	listener, err := net.Listen("tcp", *addr)
	if err != nil {
		srv.Close()
		return err
	}
	logger.Printf("%s (%s) on http://%s", cfg.Name, file, listener.Addr())
	served := make(chan error, 1)
	go func() { served <- hs.Serve(listener) }()
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	select {
	case err := <-served:
		srv.Close()
		return err
	case sig := <-signals:
		logger.Printf("%v: no new requests; ending the streams in flight", sig)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx, hs); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		logger.Printf("stopped")
		return nil
	}
}

func fileBase(path string) string {
	if i := strings.LastIndexAny(path, "/\\"); i >= 0 {
		return path[i+1:]
	}
	return path
}
