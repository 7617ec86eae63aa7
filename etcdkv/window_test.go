package etcdkv

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestStampStart(t *testing.T) {
	t.Parallel()
	tests := []struct {
		start, end string
		want       int
		wantOK     bool
	}{
		{"runs/0", "runs/00000001764417600000", 5, true},                           // the expired range of a pass
		{"runs/00000001764417600000", "runs/:", 5, true},                           // its peek
		{"runs/00000001764417600123/id\x00", "runs/00000001764417600500", 5, true}, // a next page
		{"runs/abc", "runs/z", 0, false},
		{"runs/", "runs0", 0, false},
		{"", "a", 0, false},
		{"7", "8", 0, true},
	}
	for _, tt := range tests {
		got, ok := stampStart([]byte(tt.start), []byte(tt.end))
		assert.Equal(t, tt.wantOK, ok, "stampStart(%q, %q) ok", tt.start, tt.end)
		if tt.wantOK {
			assert.Equal(t, tt.want, got, "stampStart(%q, %q)", tt.start, tt.end)
		}
	}
}

func TestStamp(t *testing.T) {
	t.Parallel()
	tests := []struct {
		key          string
		wantMs       uint64
		wantFull, ok bool
	}{
		{"p/00000001764417600000/id", 1764417600000, true, true},
		{"p/00000001764417600000", 1764417600000, true, true},
		{"p/0", 0, false, true},
		{"p/1", 10_000_000_000_000_000_000, false, true},
		{"p/000000000000000000012345", 1, true, true}, // only 20 digits count
		{"p/99999999999999999999", 0, false, false},   // past uint64
		{"p/2", 0, false, false},                      // 2e19, past uint64 once padded
		{"p/x", 0, false, false},
		{"p/", 0, false, false},
	}
	for _, tt := range tests {
		ms, full, ok := stamp([]byte(tt.key), 2)
		assert.Equal(t, tt.ok, ok, "stamp(%q) ok", tt.key)
		if tt.ok {
			assert.Equal(t, tt.wantMs, ms, "stamp(%q)", tt.key)
			assert.Equal(t, tt.wantFull, full, "stamp(%q) full", tt.key)
		}
	}
	assert.Equal(t, "p/00000001764417600000", string(appendStamp([]byte("p/"), 1764417600000)))
}

func TestNextWindow(t *testing.T) {
	t.Parallel()
	const start, end = "p/00000000000000001000/a", "p/:"
	tests := []struct {
		name      string
		fam       family
		want      float64
		wantEnd   string
		wantWidth uint64
	}{
		{"unknown density explores", family{}, 1, "p/00000000000000002024", 1024},
		{"sized from density", family{density: 2}, 100, "p/00000000000000001050", 50},
		{"at least 1ms", family{density: 1e6}, 1, "p/00000000000000001001", 1},
		{"landmark ahead", family{density: 2, landmark: []byte("p/00000000000000009999/z")}, 100, "p/00000000000000009999/z\x00", 0},
		{"landmark behind is ignored", family{density: 2, landmark: []byte("p/00000000000000000999/z")}, 100, "p/00000000000000001050", 50},
		{"landmark at the end is ignored", family{density: 2, landmark: []byte("p/:")}, 100, "p/00000000000000001050", 50},
		{"clipped to the end", family{density: 1e-30}, 100, end, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := nextWindow([]byte(start), []byte(end), 2, tt.fam, tt.want)
			assert.Equal(t, tt.wantEnd, string(w.end), "nextWindow().end")
			assert.Equal(t, tt.wantWidth, w.width, "nextWindow().width")
		})
	}
	// A cursor without a whole timestamp reads the rest in one request.
	w := nextWindow([]byte("p/0"), []byte("p/00000001764417600000"), 2, family{density: 1}, 10)
	assert.Equal(t, "p/00000001764417600000", string(w.end))
}

func TestLearn(t *testing.T) {
	t.Parallel()
	keys := func(ks ...string) [][]byte {
		out := make([][]byte, len(ks))
		for i, k := range ks {
			out[i] = []byte(k)
		}
		return out
	}
	fam := family{}
	learn(&fam, window{width: 100}, 2, nil, 10, 0)
	assert.Equal(t, exploreDensity/growth, fam.density, "an empty window divides the density")
	learn(&fam, window{width: 100}, 2, keys("p/00000000000000000001"), 10, 50)
	assert.Equal(t, 0.5, fam.density, "a sized window counts its keys")
	learn(&fam, window{}, 2, keys("p/00000000000000000010/a", "p/00000000000000000019/b"), 2, 1000)
	assert.Equal(t, 0.2, fam.density, "a full unsized page measures its own spread")
	learn(&fam, window{}, 2, keys("p/00000000000000000010/a"), 2, 1)
	assert.Equal(t, 0.2, fam.density, "a short unsized page teaches nothing")
}

// FuzzNextWindow checks what Scan's correctness rests on: every window ends
// after its cursor and no later than the range's end, whatever was learned.
func FuzzNextWindow(f *testing.F) {
	f.Add([]byte("p/0"), []byte("p/00000001764417600000"), []byte(nil), 1.0, 10.0)
	f.Add([]byte("p/00000001764417600000"), []byte("p/:"), []byte("p/00000001764417600001/x"), 0.0, 9.0)
	f.Add([]byte("p/99999999999999999999"), []byte("p/:"), []byte(nil), 1e-300, 1e300)
	f.Add([]byte("p/18446744073709551615/"), []byte("p/18446744073709551616"), []byte("p/1"), 3.0, 400.0)
	f.Fuzz(func(t *testing.T, start, end, landmark []byte, density, want float64) {
		if bytes.Compare(start, end) >= 0 || !(want >= 1 && want < 1e6) {
			return
		}
		t0, ok := stampStart(start, end)
		if !ok {
			return
		}
		w := nextWindow(start, end, t0, family{density: density, landmark: landmark}, want)
		if bytes.Compare(w.end, start) <= 0 || bytes.Compare(w.end, end) > 0 {
			t.Fatalf("nextWindow(%q, %q) = %q, want in (start, end]", start, end, w.end)
		}
	})
}
