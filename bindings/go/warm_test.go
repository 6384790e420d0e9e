package flashattn

// CacheWarm (fa_cache_warm, C API 0.7): a cache warmed with no GPU for sm_80
// and sm_90 serves an emulator runtime at that SM with no kernel built (a
// forward and a split decode checked against the float64 reference); bad
// input is the library's error naming the line and key; Progress is called
// once per kernel, and a panic in it comes back after the call.

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// warmSpecs are the kernels warmRun launches: the forward, the decode and
// its combine.
const warmSpecs = `# fp16, head_dim 64, 2 heads
forward dtype=fp16 head_dim=64 num_heads_q=2 num_heads_kv=2
decode  dtype=fp16 head_dim=64 num_heads_q=2 num_heads_kv=2
reduce  dtype=fp16 head_dim=64
`

// warmDir is a fresh scratch cache directory, mode 0700.
func warmDir(t *testing.T) string {
	d := filepath.Join(t.TempDir(), "cache")
	if err := os.Mkdir(d, 0o700); err != nil {
		t.Fatal(err)
	}
	return d
}

func warmOpts(dir string, sms ...int) WarmOptions {
	return WarmOptions{SMs: sms, Specs: warmSpecs, CacheDir: dir, Jobs: 2, PTXOnly: true}
}

// warmRun runs a causal forward and a 2-split decode (fresh inputs, checked
// against the reference) on an emulator runtime at sm over dir ("": memory
// only) and returns its cache counters.
func warmRun(t *testing.T, sm int32, dir string, seed int64) CacheStats {
	t.Helper()
	o := &RuntimeOptions{Backend: BackendEmulator, EmulatorSM: sm, CacheMode: CacheMemory}
	if dir != "" {
		o.CacheMode, o.CacheDir = CacheDisk, dir
	}
	rt, err := NewRuntime(o)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	cfg := newCfg(t, ConfigDesc{HeadDim: 64, NumHeadsQ: 2, NumHeadsKV: 2, Causal: true})
	p := problem{batch: 2, sq: 24, skMax: 24, hq: 2, hkv: 2, d: 64, dv: 64, causal: true, scale: 1 / math.Sqrt(64)}
	forwardCase(t, rt, cfg, p, seed)
	dec := problem{batch: 2, sq: 1, skMax: 160, hq: 2, hkv: 2, d: 64, dv: 64, causal: true,
		scale: 1 / math.Sqrt(64), kvLen: []int{130, 77}}
	decodeChecked(t, rt, cfg, newDecode(t, rt, dec, seed+1), 2)
	st, err := rt.CacheStats()
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestCacheWarmThenRun(t *testing.T) {
	dir := warmDir(t)
	var calls []WarmProgress
	o := warmOpts(dir, 80, 90)
	o.Progress = func(p WarmProgress) { calls = append(calls, p) }
	c, err := CacheWarm(o)
	if err != nil {
		t.Fatal(err)
	}
	if c.Total != 6 || c.Done != 6 || c.Built != 6 || c.Present != 0 || c.Failed != 0 || c.Skipped != 0 ||
		c.Bytes == 0 || c.Elapsed < 0 || c.Compiler != "" {
		t.Fatalf("counts %+v", c)
	}
	// Progress: once per kernel, in order, consistent counts.
	if len(calls) != 6 {
		t.Fatalf("%d progress calls, want 6", len(calls))
	}
	per := map[int]int{}
	for i, p := range calls {
		if p.Done != uint64(i+1) || p.Total != 6 || p.Built+p.Present+p.Failed != p.Done || p.Spec == "" {
			t.Fatalf("progress %d: %+v", i, p)
		}
		per[p.SM]++
	}
	if !reflect.DeepEqual(per, map[int]int{80: 3, 90: 3}) {
		t.Fatalf("progress per SM %v", per)
	}
	if last := calls[5]; last.Built != c.Built || last.Bytes != c.Bytes {
		t.Fatalf("last progress %+v, result %+v", last, c)
	}
	for _, sm := range []int32{80, 90} {
		st := warmRun(t, sm, dir, int64(sm))
		if !st.Persistent || !strings.HasPrefix(st.Path, dir) || st.Misses != 0 || st.Compiles != 0 || st.DiskHits != 3 {
			t.Fatalf("sm_%d on the warmed cache: %+v", sm, st)
		}
		if control := warmRun(t, sm, "", int64(sm)+7); control.Misses != 3 {
			t.Fatalf("sm_%d control built %d kernels, want 3", sm, control.Misses)
		}
	}
	// Again: every row present; sm_120's rows are added beside.
	sms, err := ParseSMs("80,90a,120f")
	if err != nil {
		t.Fatal(err)
	}
	c, err = CacheWarm(warmOpts(dir, sms...))
	if err != nil || c.Total != 9 || c.Present != 6 || c.Built != 3 {
		t.Fatalf("again: %+v %v", c, err)
	}
}

func TestParseSMs(t *testing.T) {
	got, err := ParseSMs("sm_100a,90a,120f,89,86")
	if err != nil || !reflect.DeepEqual(got, []int{100, 90, 120, 89, 86}) {
		t.Fatalf("ParseSMs = %v, %v", got, err)
	}
	for _, bad := range []string{"", "80,", "9x", "sm_", "a", "80,+90", "-80", "12345"} {
		_, err := ParseSMs(bad)
		wantErr(t, err, StatusInvalidArgument, "is not an SM")
	}
}

func TestCacheWarmPresets(t *testing.T) {
	presets := CacheWarmPresets()
	names := map[string]bool{}
	for _, p := range presets {
		names[p.Name] = true
		text, err := CacheWarmPreset(p.Name)
		if err != nil || p.Description == "" || !strings.HasPrefix(text, "# "+p.Name+":") {
			t.Fatalf("preset %+v: %q %v", p, text, err)
		}
		for _, kind := range []string{"\nforward ", "\ndecode ", "\nreduce "} {
			if !strings.Contains(text, kind) {
				t.Fatalf("preset %s lacks%q", p.Name, kind)
			}
		}
	}
	if len(presets) < 9 || !names["llama-3-8b"] || !names["gpt-oss"] || !names["deepseek-v3"] {
		t.Fatalf("presets %v", presets)
	}
	_, err := CacheWarmPreset("llama-9")
	wantErr(t, err, StatusInvalidArgument, "unknown preset 'llama-9'")
	wantErr(t, err, StatusInvalidArgument, "gpt-oss:")
	// gpt-oss on sm_80 and sm_86: its e4m3 KV decodes need sm_89 (skipped).
	text, _ := CacheWarmPreset("gpt-oss")
	fp8Lines := strings.Count(text, "kv_dtype=0,e4m3")
	c, err := CacheWarm(WarmOptions{SMs: []int{80, 86}, Presets: []string{"gpt-oss"}, CacheDir: warmDir(t), PTXOnly: true})
	if err != nil || fp8Lines != 2 || c.Skipped != uint64(2*fp8Lines) || c.Total == 0 || c.Built != c.Total {
		t.Fatalf("gpt-oss on 80, 86: %+v %v (fp8 lines %d)", c, err, fp8Lines)
	}
}

func TestCacheWarmBadInput(t *testing.T) {
	dir := warmDir(t)
	withSpecs := func(specs string) WarmOptions { o := warmOpts(dir, 80); o.Specs = specs; return o }
	noSpecs := warmOpts(dir, 80)
	noSpecs.Specs = ""
	badPreset := noSpecs
	badPreset.Presets = []string{"llama-3-8b,llama-9"}
	badJobs := warmOpts(dir, 80)
	badJobs.Jobs = -1
	cases := []struct {
		o     WarmOptions
		s     Status
		words []string
	}{
		{warmOpts(dir), StatusInvalidArgument, []string{"sms must name at least one SM"}},
		{warmOpts(dir, 80, 75), StatusUnsupported, []string{"sms[1]", "got 75"}},
		{warmOpts(dir, 80, 1<<40), StatusInvalidArgument, []string{"sms[1]", "does not fit int32"}},
		{noSpecs, StatusInvalidArgument, []string{"neither presets nor specs"}},
		{badPreset, StatusInvalidArgument, []string{"unknown preset 'llama-9'", "gpt-oss:"}},
		{withSpecs("forward dtype=fp16 head_dim=64\ndecode dtype=fp16 heads=2"), StatusInvalidArgument,
			[]string{"specs line 2", "unknown key 'heads'"}},
		{withSpecs("forward dtype=fp15 head_dim=64"), StatusInvalidArgument,
			[]string{"specs line 1", "'fp15' is not a value of dtype"}},
		{withSpecs("\nreduce dtype=fp16 head_dim=64 varlen=1"), StatusInvalidArgument, []string{"specs line 2", "varlen"}},
		{badJobs, StatusInvalidArgument, []string{"jobs"}},
	}
	for i, c := range cases {
		c := c
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			_, err := CacheWarm(c.o)
			for _, w := range c.words {
				wantErr(t, err, c.s, w)
			}
		})
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("bad input wrote %v", entries)
	}
	// A directory others may write is not a cache to run code from.
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	_, err := CacheWarm(warmOpts(dir, 80))
	wantErr(t, err, StatusCache, "cannot be written")
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("an untrusted directory got %v", entries)
	}
}

func TestCacheWarmProgressPanic(t *testing.T) {
	dir := warmDir(t)
	calls := 0
	o := warmOpts(dir, 80, 89)
	o.Progress = func(WarmProgress) {
		calls++
		if calls == 2 {
			panic("from progress")
		}
	}
	func() {
		defer func() {
			if v := recover(); v != "from progress" {
				t.Fatalf("recovered %v, want the progress panic", v)
			}
		}()
		CacheWarm(o)
		t.Fatal("CacheWarm returned instead of panicking")
	}()
	if calls != 2 {
		t.Fatalf("progress called %d times, want 2 (not again once it panicked)", calls)
	}
	// The call itself ran to the end: every kernel was written.
	c, err := CacheWarm(warmOpts(dir, 80, 89))
	if err != nil || c.Total != 6 || c.Present != 6 || c.Built != 0 {
		t.Fatalf("after the panic: %+v %v", c, err)
	}
}
