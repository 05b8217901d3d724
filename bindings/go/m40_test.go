package m40

import (
	"os"
	"strings"
	"sync"
	"testing"
)

// The Gemma 3 270M model the repository's tests use ($M40_GEMMA_GGUF).
func gemma(t *testing.T) *Model {
	t.Helper()
	path := os.Getenv("M40_GEMMA_GGUF")
	if path == "" {
		t.Skip("M40_GEMMA_GGUF is not set")
	}
	m, err := Load(path, ModelParams{Device: -1, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func TestLoadErrorsCarryTheStatusAndMessage(t *testing.T) {
	_, err := Load("/nonexistent/model.gguf", ModelParams{Device: -1})
	if !IsStatus(err, IO) || !strings.Contains(err.Error(), "/nonexistent/model.gguf") {
		t.Fatalf("want an IO error naming the path, got %v", err)
	}
	if IO.String() == "" || Status(99).String() != "status 99" {
		t.Fatal("statuses have names")
	}
}

func TestGenerateStreamsLlamaCppsGreedyText(t *testing.T) {
	m := gemma(t)
	s, err := m.NewSession(0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var text strings.Builder
	err = s.Generate("The capital of France is", Greedy(), 8, func(piece string) bool {
		text.WriteString(piece)
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	// llama.cpp's greedy continuation (tests/data/reference in the repository).
	if !strings.HasPrefix(text.String(), " the capital of the country of France.") {
		t.Fatalf("got %q", text.String())
	}
	if s.NPast() != 6+8-1 && s.NPast() != 6+8 {
		t.Fatalf("n_past %d after a 6-token prompt and 8 tokens", s.NPast())
	}
	if s.MemoryBytes() == 0 {
		t.Fatal("a session's cache holds memory")
	}
}

func TestASplitModelGivesTheUnsplitLogits(t *testing.T) {
	m := gemma(t)
	split, err := Load(os.Getenv("M40_GEMMA_GGUF"), ModelParams{
		Threads: 2,
		Split:   []DeviceShare{{Device: -1, Share: 1}, {Device: -1, Share: 2}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer split.Close()
	if d, err := split.Describe(); err != nil || !strings.Contains(d, `"layers":[0,6],"embedding":true`) {
		t.Fatalf("the split is not described: %s %v", d, err)
	}
	logits := func(m *Model) []float32 {
		s, err := m.NewSession(64)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if err := s.Decode([]Token{2, 818, 5279, 529, 7001, 563}); err != nil {
			t.Fatal(err)
		}
		out, err := s.Logits(nil)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	want, got := logits(m), logits(split)
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("logit %d: %v split, %v unsplit", i, got[i], want[i])
		}
	}
	if _, err := Load(os.Getenv("M40_GEMMA_GGUF"), ModelParams{Split: []DeviceShare{{Device: -1, Share: -1}}}); !IsStatus(err, InvalidArgument) {
		t.Fatalf("a negative share: %v", err)
	}
}

func TestACallbackStopsOrPanicsWithoutCrossingTheLibrary(t *testing.T) {
	m := gemma(t)
	s, _ := m.NewSession(0)
	defer s.Close()
	calls := 0
	if err := s.Generate("Hello", Greedy(), 8, func(string) bool { calls++; return false }); err != nil {
		t.Fatal(err)
	}
	if calls != 1 {
		t.Fatalf("%d calls after returning false", calls)
	}
	defer func() {
		if r := recover(); r != "stop here" {
			t.Fatalf("recovered %v", r)
		}
		// The session is still usable.
		if err := s.Generate(" again", Greedy(), 2, func(string) bool { return true }); err != nil {
			t.Fatal(err)
		}
	}()
	s.Generate("Hello", Greedy(), 8, func(string) bool { panic("stop here") })
}

func TestTokenizerAndChatTemplate(t *testing.T) {
	m := gemma(t)
	tokens, err := m.Tokenize("The capital of France is", true)
	if err != nil || len(tokens) != 6 || tokens[0] != 2 {
		t.Fatalf("tokens %v, %v", tokens, err)
	}
	text, err := m.Detokenize(tokens[1:])
	if err != nil || text != "The capital of France is" {
		t.Fatalf("%q, %v", text, err)
	}
	chat, err := m.ApplyChatTemplate([]ChatMessage{{"user", "Hi"}}, true)
	if err != nil || chat != "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n" {
		t.Fatalf("%q, %v", chat, err)
	}
	if _, err := m.ApplyChatTemplate([]ChatMessage{{"robot", "beep"}}, true); !IsStatus(err, InvalidArgument) {
		t.Fatalf("a bad role: %v", err)
	}
	desc, err := m.Describe()
	if err != nil || !strings.Contains(desc, `"chat_template":"gemma"`) {
		t.Fatalf("%s, %v", desc, err)
	}
}

func TestDecodeBatchMatchesSingleSessionsAcrossGoroutines(t *testing.T) {
	m := gemma(t)
	prompt, _ := m.Tokenize("Once upon a time", true)
	// Two sessions decoded together against one decoded alone, then greedy
	// continuations compared.
	a, _ := m.NewSession(0)
	b, _ := m.NewSession(0)
	single, _ := m.NewSession(0)
	defer a.Close()
	defer b.Close()
	defer single.Close()
	var wg sync.WaitGroup
	for _, s := range []*Session{a, b, single} {
		wg.Add(1)
		go func(s *Session) {
			defer wg.Done()
			if err := s.Decode(prompt); err != nil {
				t.Error(err)
			}
		}(s)
	}
	wg.Wait()
	for step := 0; step < 4; step++ {
		ta, _ := a.Sample(Greedy())
		tb, _ := b.Sample(Greedy())
		ts, _ := single.Sample(Greedy())
		if ta != ts || tb != ts {
			t.Fatalf("step %d: batched %d %d, single %d", step, ta, tb, ts)
		}
		if err := DecodeBatch([]*Session{a, b}, []Token{ta, tb}); err != nil {
			t.Fatal(err)
		}
		if err := single.Decode([]Token{ts}); err != nil {
			t.Fatal(err)
		}
	}
	if err := DecodeBatch([]*Session{a}, []Token{1, 2}); !IsStatus(err, InvalidArgument) {
		t.Fatalf("a count mismatch: %v", err)
	}
	if err := DecodeBatch([]*Session{a, a}, []Token{1, 2}); !IsStatus(err, InvalidArgument) {
		t.Fatalf("a session twice: %v", err)
	}
}

func TestDecodeBatchSamplePicksWhatDecodeBatchThenSamplePicks(t *testing.T) {
	m := gemma(t)
	prompt, _ := m.Tokenize("The capital of France is", true)
	params := []SamplerParams{Greedy(), DefaultSampler()}
	params[1].Seed = 42
	var plain, sampled []*Session
	for i := 0; i < 4; i++ {
		s, _ := m.NewSession(64)
		defer s.Close()
		if err := s.Decode(prompt); err != nil {
			t.Fatal(err)
		}
		if i < 2 {
			plain = append(plain, s)
		} else {
			sampled = append(sampled, s)
		}
	}
	next := []Token{prompt[1], prompt[2]}
	for step := 0; step < 4; step++ {
		if err := DecodeBatch(plain, next); err != nil {
			t.Fatal(err)
		}
		want := make([]Token, 2)
		for i, s := range plain {
			want[i], _ = s.Sample(params[i])
		}
		got, err := DecodeBatchSample(sampled, next, params)
		if err != nil {
			t.Fatal(err)
		}
		if got[0] != want[0] || got[1] != want[1] {
			t.Fatalf("step %d: sampled batch %v, decode then sample %v", step, got, want)
		}
		next = got
	}
	if _, err := DecodeBatchSample(sampled, next, params[:1]); !IsStatus(err, InvalidArgument) {
		t.Fatalf("a parameter count mismatch: %v", err)
	}
}

func TestClosedHandlesAreErrorsAndCloseIsIdempotent(t *testing.T) {
	m := gemma(t)
	s, _ := m.NewSession(16)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Decode([]Token{2}); !IsStatus(err, InvalidArgument) {
		t.Fatalf("decode after close: %v", err)
	}
	// A full context is its own status.
	full, _ := m.NewSession(8)
	defer full.Close()
	if err := full.Decode(make([]Token, 9)); !IsStatus(err, ContextFull) {
		t.Fatalf("past n_ctx: %v", err)
	}
}
