package store

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strings"
)

// Info is what a GGUF file's header says about its model, read without
// loading it.
type Info struct {
	Architecture  string
	Name          string // general.name
	ContextLength uint64 // {arch}.context_length
	Parameters    uint64 // elements of all tensors
	Tensors       int
	TypeBytes     map[string]uint64 // tensor bytes by type
	ChatTemplate  string            // tokenizer.chat_template, raw
	Metadata      []KV              // every key, arrays summarized
}

// KV is one metadata key and its value as text.
type KV struct{ Key, Value string }

// TypeMix is the tensor types by their share of the bytes, largest first
// ("Q4_K 71%, Q6_K 21%, F32 8%").
func (in *Info) TypeMix() string {
	var total uint64
	names := make([]string, 0, len(in.TypeBytes))
	for name, b := range in.TypeBytes {
		total += b
		names = append(names, name)
	}
	sort.Slice(names, func(i, j int) bool {
		return in.TypeBytes[names[i]] > in.TypeBytes[names[j]] ||
			in.TypeBytes[names[i]] == in.TypeBytes[names[j]] && names[i] < names[j]
	})
	parts := make([]string, 0, len(names))
	for _, name := range names {
		share := 100 * float64(in.TypeBytes[name]) / math.Max(float64(total), 1)
		if share >= 0.5 {
			parts = append(parts, fmt.Sprintf("%s %.0f%%", name, share))
		}
	}
	return strings.Join(parts, ", ")
}

// ggmlType: a tensor type's name and storage (elements a block, bytes a
// block), as ggml defines them.
type ggmlType struct {
	name         string
	block, bytes uint64
}

var ggmlTypes = map[uint32]ggmlType{
	0: {"F32", 1, 4}, 1: {"F16", 1, 2}, 2: {"Q4_0", 32, 18}, 3: {"Q4_1", 32, 20},
	6: {"Q5_0", 32, 22}, 7: {"Q5_1", 32, 24}, 8: {"Q8_0", 32, 34}, 9: {"Q8_1", 32, 36},
	10: {"Q2_K", 256, 84}, 11: {"Q3_K", 256, 110}, 12: {"Q4_K", 256, 144}, 13: {"Q5_K", 256, 176},
	14: {"Q6_K", 256, 210}, 15: {"Q8_K", 256, 292}, 16: {"IQ2_XXS", 256, 66}, 17: {"IQ2_XS", 256, 74},
	18: {"IQ3_XXS", 256, 98}, 19: {"IQ1_S", 256, 50}, 20: {"IQ4_NL", 32, 18}, 21: {"IQ3_S", 256, 110},
	22: {"IQ2_S", 256, 82}, 23: {"IQ4_XS", 256, 136}, 24: {"I8", 1, 1}, 25: {"I16", 1, 2},
	26: {"I32", 1, 4}, 27: {"I64", 1, 8}, 28: {"F64", 1, 8}, 29: {"IQ1_M", 256, 56},
	30: {"BF16", 1, 2}, 34: {"TQ1_0", 256, 54}, 35: {"TQ2_0", 256, 66}, 39: {"MXFP4", 32, 17},
}

// Limits that keep a hostile header from taking the machine's memory.
const (
	maxString = 64 << 20
	maxDims   = 8
)

type reader struct {
	r   *bufio.Reader
	err error
}

func (r *reader) u32() uint32 {
	var b [4]byte
	r.read(b[:])
	return binary.LittleEndian.Uint32(b[:])
}

func (r *reader) u64() uint64 {
	var b [8]byte
	r.read(b[:])
	return binary.LittleEndian.Uint64(b[:])
}

func (r *reader) read(b []byte) {
	if r.err == nil {
		_, r.err = io.ReadFull(r.r, b)
	}
}

func (r *reader) str() string {
	n := r.u64()
	if r.err != nil {
		return ""
	}
	if n > maxString {
		r.err = fmt.Errorf("a string of %d bytes", n)
		return ""
	}
	b := make([]byte, n)
	r.read(b)
	return string(b)
}

// value reads a value of GGUF type t as text; arrays are summarized.
func (r *reader) value(t uint32, depth int) string {
	var b [8]byte
	switch t {
	case 0, 1, 7: // u8, i8, bool
		r.read(b[:1])
		switch t {
		case 0:
			return fmt.Sprint(b[0])
		case 1:
			return fmt.Sprint(int8(b[0]))
		}
		return fmt.Sprint(b[0] != 0)
	case 2, 3:
		r.read(b[:2])
		v := binary.LittleEndian.Uint16(b[:2])
		if t == 3 {
			return fmt.Sprint(int16(v))
		}
		return fmt.Sprint(v)
	case 4, 5, 6:
		v := r.u32()
		switch t {
		case 5:
			return fmt.Sprint(int32(v))
		case 6:
			return fmt.Sprint(math.Float32frombits(v))
		}
		return fmt.Sprint(v)
	case 10, 11, 12:
		v := r.u64()
		switch t {
		case 11:
			return fmt.Sprint(int64(v))
		case 12:
			return fmt.Sprint(math.Float64frombits(v))
		}
		return fmt.Sprint(v)
	case 8:
		return r.str()
	case 9:
		elem, n := r.u32(), r.u64()
		if depth > 2 {
			r.err = errors.New("arrays nested too deeply")
			return ""
		}
		var first []string
		for i := uint64(0); i < n && r.err == nil; i++ {
			v := r.value(elem, depth+1)
			if i < 3 {
				first = append(first, fmt.Sprintf("%q", v))
			}
		}
		more := ""
		if n > 3 {
			more = ", ..."
		}
		return fmt.Sprintf("[%d items: %s%s]", n, strings.Join(first, ", "), more)
	}
	r.err = fmt.Errorf("a value of unknown type %d", t)
	return ""
}

// ReadInfo reads a GGUF file's header: its metadata and tensor list.
func ReadInfo(path string) (*Info, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := &reader{r: bufio.NewReaderSize(f, 1<<20)}
	var magic [4]byte
	r.read(magic[:])
	if r.err != nil || string(magic[:]) != "GGUF" {
		return nil, fmt.Errorf("%s is not a GGUF file", path)
	}
	version := r.u32()
	if version < 2 || version > 3 {
		return nil, fmt.Errorf("%s: GGUF version %d (2 and 3 are read)", path, version)
	}
	nTensors, nKV := r.u64(), r.u64()
	info := &Info{TypeBytes: map[string]uint64{}}
	values := map[string]string{}
	for i := uint64(0); i < nKV && r.err == nil; i++ {
		key := r.str()
		v := r.value(r.u32(), 0)
		if r.err == nil {
			values[key] = v
			shown := v
			if len(shown) > 200 {
				shown = fmt.Sprintf("%q... (%d bytes)", shown[:200], len(shown))
			}
			info.Metadata = append(info.Metadata, KV{key, shown})
		}
	}
	for i := uint64(0); i < nTensors && r.err == nil; i++ {
		r.str()
		nDims := r.u32()
		if nDims > maxDims {
			r.err = fmt.Errorf("a tensor of %d dimensions", nDims)
			break
		}
		elements := uint64(1)
		for d := uint32(0); d < nDims; d++ {
			dim := r.u64()
			if dim != 0 && elements > math.MaxUint64/dim {
				r.err = errors.New("a tensor's size overflows")
			}
			elements *= dim
		}
		t := r.u32()
		r.u64() // offset
		if r.err != nil {
			break
		}
		info.Parameters += elements
		info.Tensors++
		if gt, ok := ggmlTypes[t]; ok {
			info.TypeBytes[gt.name] += elements / gt.block * gt.bytes
		}
	}
	if r.err != nil {
		return nil, fmt.Errorf("%s: the GGUF header is cut short or malformed: %v", path, r.err)
	}
	info.Architecture = values["general.architecture"]
	info.Name = values["general.name"]
	info.ChatTemplate = values["tokenizer.chat_template"]
	fmt.Sscan(values[info.Architecture+".context_length"], &info.ContextLength)
	return info, nil
}
