package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	m40 "m40llm/bindings/go"
)

// A server over Gemma 3 270M ($M40_GEMMA_GGUF) on a loopback port.
func serve(t *testing.T) (*Server, *httptest.Server) {
	t.Helper()
	path := os.Getenv("M40_GEMMA_GGUF")
	if path == "" {
		t.Skip("M40_GEMMA_GGUF is not set")
	}
	model, err := m40.Load(path, m40.ModelParams{Device: -1, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	server := NewServer(model, path, 512, 8)
	http := httptest.NewServer(server)
	t.Cleanup(func() {
		http.Close()
		server.Close()
		model.Close()
	})
	return server, http
}

func post(t *testing.T, url, body string) *http.Response {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// The text of a streamed completion, its finish reason and its event count
// (safe in any goroutine: failures are returned).
func readStream(resp *http.Response, chat bool) (text string, finish string, events int, err error) {
	defer resp.Body.Close()
	var out strings.Builder
	scanner := bufio.NewScanner(resp.Body)
	for scanner.Scan() {
		line := scanner.Text()
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		data := strings.TrimPrefix(line, "data: ")
		if data == "[DONE]" {
			return out.String(), finish, events, nil
		}
		events++
		var chunk struct {
			Choices []struct {
				Text         string                   `json:"text"`
				Delta        struct{ Content string } `json:"delta"`
				FinishReason *string                  `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &chunk); err != nil {
			return "", "", 0, fmt.Errorf("%s: %v", data, err)
		}
		c := chunk.Choices[0]
		if chat {
			out.WriteString(c.Delta.Content)
		} else {
			out.WriteString(c.Text)
		}
		if c.FinishReason != nil {
			finish = *c.FinishReason
		}
	}
	return "", "", 0, fmt.Errorf("the stream ended without [DONE]")
}

const prompt = `"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0`

// llama.cpp's greedy continuation (tests/data/reference in the repository).
const reference = " the capital of the country of France."

func TestModelsAndACompletion(t *testing.T) {
	_, srv := serve(t)
	resp, err := http.Get(srv.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var models struct{ Data []struct{ ID string } }
	json.NewDecoder(resp.Body).Decode(&models)
	if len(models.Data) != 1 || models.Data[0].ID == "" {
		t.Fatalf("%+v", models)
	}
	resp = post(t, srv.URL+"/v1/completions", "{"+prompt+"}")
	var completion struct {
		Choices []struct {
			Text         string
			FinishReason string `json:"finish_reason"`
		}
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		}
	}
	json.NewDecoder(resp.Body).Decode(&completion)
	c := completion.Choices[0]
	if !strings.HasPrefix(c.Text, reference) || c.FinishReason != "length" ||
		completion.Usage.PromptTokens != 6 || completion.Usage.CompletionTokens != 8 {
		t.Fatalf("%+v", completion)
	}
}

func TestConcurrentStreamsAreBatchedAndMatchTheSingleResult(t *testing.T) {
	server, srv := serve(t)
	var wg sync.WaitGroup
	texts := make([]string, 4)
	for i := range texts {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			resp, err := http.Post(srv.URL+"/v1/completions", "application/json",
				strings.NewReader("{"+prompt+`, "stream": true}`))
			if err != nil {
				t.Error(err)
				return
			}
			text, finish, events, err := readStream(resp, false)
			if err != nil || finish != "length" || events < 2 {
				t.Errorf("finish %q after %d events: %v", finish, events, err)
			}
			texts[i] = text
		}(i)
	}
	wg.Wait()
	for _, text := range texts {
		if !strings.HasPrefix(text, reference) {
			t.Fatalf("%q", texts)
		}
	}
	if server.maxBatch.Load() < 2 {
		t.Fatalf("at most %d requests per decode step", server.maxBatch.Load())
	}
}

func TestChatCompletionsStreamAndWhole(t *testing.T) {
	_, srv := serve(t)
	body := `{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "temperature": 0`
	whole := post(t, srv.URL+"/v1/chat/completions", body+"}")
	var completion struct {
		Object  string
		Choices []struct {
			Message struct{ Role, Content string }
		}
	}
	json.NewDecoder(whole.Body).Decode(&completion)
	if completion.Object != "chat.completion" || completion.Choices[0].Message.Role != "assistant" {
		t.Fatalf("%+v", completion)
	}
	streamed, _, _, err := readStream(post(t, srv.URL+"/v1/chat/completions", body+`, "stream": true}`), true)
	if err != nil || streamed != completion.Choices[0].Message.Content {
		t.Fatalf("streamed %q, whole %q", streamed, completion.Choices[0].Message.Content)
	}
}

func TestAClientThatDisconnectsMidStreamIsDropped(t *testing.T) {
	server, srv := serve(t)
	resp := post(t, srv.URL+"/v1/completions", `{"prompt": "Once upon a time", "max_tokens": 400, "temperature": 0, "stream": true}`)
	reader := bufio.NewReader(resp.Body)
	if line, err := reader.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("%q, %v", line, err)
	}
	resp.Body.Close()
	deadline := time.Now().Add(30 * time.Second)
	for server.active.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the request is still generating after its client left")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The server goes on serving.
	resp = post(t, srv.URL+"/v1/completions", "{"+prompt+"}")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
}

func TestBadRequestsAreErrors(t *testing.T) {
	_, srv := serve(t)
	for _, body := range []string{`{not json`, `{"max_tokens": 3}`, `{"messages": [{"role": "robot", "content": "x"}]}`} {
		url := srv.URL + "/v1/completions"
		if strings.Contains(body, "messages") {
			url = srv.URL + "/v1/chat/completions"
		}
		resp := post(t, url, body)
		var e struct{ Error struct{ Message string } }
		json.NewDecoder(resp.Body).Decode(&e)
		if resp.StatusCode != http.StatusBadRequest || e.Error.Message == "" {
			t.Fatalf("%s: status %d, %+v", body, resp.StatusCode, e)
		}
	}
}

func TestAStoppedServerRefusesRequests(t *testing.T) {
	server, srv := serve(t)
	server.Close()
	resp := post(t, srv.URL+"/v1/completions", "{"+prompt+"}")
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status %d", resp.StatusCode)
	}
}
