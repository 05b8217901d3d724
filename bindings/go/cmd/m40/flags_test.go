package main

import (
	"flag"
	"reflect"
	"testing"

	m40 "m40llm/bindings/go"
)

func TestDevicesAndSplitFlagsMakeASplit(t *testing.T) {
	parse := func(args ...string) (m40.ModelParams, error) {
		fs := flag.NewFlagSet("run", flag.ContinueOnError)
		mf := addModelFlags(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return mf.params()
	}
	p, err := parse("-devices", "-1,0", "-split", "3,1", "-threads", "4")
	want := []m40.DeviceShare{{Device: -1, Share: 3}, {Device: 0, Share: 1}}
	if err != nil || !reflect.DeepEqual(p.Split, want) || p.Threads != 4 {
		t.Fatalf("got %+v, %v", p, err)
	}
	p, err = parse("-devices", "0,1")
	want = []m40.DeviceShare{{Device: 0, Share: 0}, {Device: 1, Share: 0}}
	if err != nil || !reflect.DeepEqual(p.Split, want) {
		t.Fatalf("shares from free memory: got %+v, %v", p, err)
	}
	if p, err = parse("-device", "-1"); err != nil || p.Split != nil || p.Device != -1 {
		t.Fatalf("one device: got %+v, %v", p, err)
	}
	for _, bad := range [][]string{{"-split", "1,1"}, {"-devices", "0,x"}, {"-devices", "0,1", "-split", "1"}, {"-devices", "0", "-split", "y"}} {
		if _, err := parse(bad...); err == nil {
			t.Fatalf("%v was accepted", bad)
		}
	}
}
