package server

import (
	"bytes"
	"unicode/utf8"
)

// stopper finds a request's stop strings in generated text, holding back
// what may still become one so that no part of a stop string is ever sent.
type stopper struct {
	stops [][]byte
}

// find returns where the earliest stop string begins in text.
func (s *stopper) find(text []byte) (int, bool) {
	at, found := len(text), false
	for _, stop := range s.stops {
		if i := bytes.Index(text, stop); i >= 0 && i < at {
			at, found = i, true
		}
	}
	return at, found
}

// sendable is how much of text can go out now: all of it but a trailing
// incomplete UTF-8 character and the longest suffix that begins a stop
// string.
func (s *stopper) sendable(text []byte) int {
	keep := 0
	for _, stop := range s.stops {
		for n := len(stop) - 1; n > keep; n-- {
			if n <= len(text) && bytes.HasSuffix(text, stop[:n]) {
				keep = n
				break
			}
		}
	}
	cut := len(text) - keep
	return completeUTF8(text[:cut])
}

// completeUTF8 is the length of text without a trailing incomplete
// character (at most three bytes go).
func completeUTF8(text []byte) int {
	for back := 1; back <= 3 && back <= len(text); back++ {
		b := text[len(text)-back]
		if b < 0x80 {
			return len(text) // ASCII: complete
		}
		if b >= 0xC0 { // a lead byte: complete only if its sequence is
			if utf8.FullRune(text[len(text)-back:]) {
				return len(text)
			}
			return len(text) - back
		}
	}
	return len(text)
}
