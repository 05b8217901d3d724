// Package store is the model store of the `m40` program: GGUF files in one
// folder ($M40_MODELS, default $XDG_DATA_HOME/m40/models), downloads that
// resume, are checked by sha256 and appear only once complete.
package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Store is a folder of models; downloads in progress live in its .partial
// subfolder and are never listed.
type Store struct{ Dir string }

// Default is the store at $M40_MODELS, else $XDG_DATA_HOME/m40/models, else
// ~/.local/share/m40/models.
func Default() (Store, error) {
	if dir := os.Getenv("M40_MODELS"); dir != "" {
		return Store{dir}, nil
	}
	data := os.Getenv("XDG_DATA_HOME")
	if data == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return Store{}, fmt.Errorf("no model store: set M40_MODELS (%v)", err)
		}
		data = filepath.Join(home, ".local", "share")
	}
	return Store{filepath.Join(data, "m40", "models")}, nil
}

// Entry is a model in the store.
type Entry struct {
	Name    string // the file's name without .gguf
	Path    string
	Size    int64
	ModTime time.Time
}

// List is the store's models, by name.
func (s Store) List() ([]Entry, error) {
	files, err := os.ReadDir(s.Dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Entry
	for _, f := range files {
		if f.IsDir() || !strings.HasSuffix(f.Name(), ".gguf") || strings.HasPrefix(f.Name(), ".") {
			continue
		}
		fi, err := f.Info()
		if err != nil {
			continue
		}
		out = append(out, Entry{Name: strings.TrimSuffix(f.Name(), ".gguf"),
			Path: filepath.Join(s.Dir, f.Name()), Size: fi.Size(), ModTime: fi.ModTime()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// validName accepts a model name that stays inside the store.
func validName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\\\x00") || strings.HasPrefix(name, ".") {
		return fmt.Errorf("%q is not a model name (a file name without folders, not starting with a dot)", name)
	}
	return nil
}

// modelPath is a model's name (without .gguf) and its file in the store,
// once the name is checked to stay inside the store.
func (s Store) modelPath(name string) (string, string, error) {
	name = strings.TrimSuffix(name, ".gguf")
	if err := validName(name); err != nil {
		return "", "", err
	}
	return name, filepath.Join(s.Dir, name+".gguf"), nil
}

// Find is the path of a model given by name (with or without .gguf), or
// of a GGUF file given by its path.
func (s Store) Find(name string) (string, error) {
	if strings.ContainsAny(name, "/\\") {
		if _, err := os.Stat(name); err != nil {
			return "", err
		}
		return name, nil
	}
	name, path, err := s.modelPath(name)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(path); err != nil {
		if _, local := os.Stat(name + ".gguf"); local == nil {
			return name + ".gguf", nil
		}
		return "", fmt.Errorf("no model %q in %s (m40 list shows them; m40 pull fetches one)", name, s.Dir)
	}
	return path, nil
}

// Remove deletes a model from the store.
func (s Store) Remove(name string) error {
	name, path, err := s.modelPath(name)
	if err != nil {
		return err
	}
	if err := os.Remove(path); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("no model %q in %s", name, s.Dir)
		}
		return err
	}
	return nil
}
