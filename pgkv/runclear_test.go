package pgkv

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestSplitRun: the keys of a run are the prefix, the bytes they share and
// their own, each ending at its capacity, ascending whatever order they
// came in.
func TestSplitRun(t *testing.T) {
	t.Parallel()
	assert.Nil(t, splitRun("p/", nil), "an empty run")
	assert.Nil(t, splitRun("p/", []byte("")), "an empty run")
	keys := splitRun("p/", []byte("0001,2/b,1/a,3/c"))
	assert.Equal(t, [][]byte{[]byte("p/00011/a"), []byte("p/00012/b"), []byte("p/00013/c")}, keys)
	for _, k := range keys {
		assert.Equal(t, len(k), cap(k), "key %q", k)
	}
	assert.Equal(t, [][]byte{[]byte("p/x/y")}, splitRun("p/", []byte(",x/y")), "nothing shared")
}
