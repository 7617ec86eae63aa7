package rediskv

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention/kvtest"
)

func TestJoinedRange(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		keys []string
		ok   bool
	}{
		{"none", nil, false},
		{"ascending", []string{"a", "b"}, true},
		{"a duplicate", []string{"a", "a"}, false},
		{"descending", []string{"b", "a"}, false},
		{"a newline", []string{"a", "b\nc"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			keys := make([][]byte, len(tt.keys))
			for i, k := range tt.keys {
				keys[i] = []byte(k)
			}
			_, ok := joinedRange(keys)
			assert.Equal(t, tt.ok, ok, "joinedRange(%q)", tt.keys)
		})
	}
}

// TestClearRangeScriptChecksTheMembers: a batch that is exactly the members
// of its range is cleared by clearRangeScript itself (not by clearScript
// behind it, which would hide a check that never passes), and any other
// batch makes it return -2 having changed nothing.
func TestClearRangeScriptChecksTheMembers(t *testing.T) {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: kvtest.ServerAddr(t, "RETENTION_REDIS_ADDR")})
	t.Cleanup(func() { assert.NoError(t, rdb.Close()) })
	set := fmt.Sprintf("{range-%d}:markers", os.Getpid())
	state := fmt.Sprintf("{range-%d}:state", os.Getpid())
	t.Cleanup(func() { assert.NoError(t, rdb.Del(context.Background(), set, state).Err()) })
	tests := []struct {
		name          string
		members, keys []string
		cleared       bool
	}{
		{"the whole range", []string{"k1", "k2", "k3"}, []string{"k1", "k2", "k3"}, true},
		{"one marker", []string{"k1"}, []string{"k1"}, true},
		{"a member of the range not in the batch", []string{"k1", "k2", "k3"}, []string{"k1", "k3"}, false},
		{"a marker gone", []string{"k1", "k3"}, []string{"k1", "k2", "k3"}, false},
		{"a member holding a newline", []string{"k1", "k1\nk2", "k2"}, []string{"k1", "k2"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.NoError(t, rdb.Del(ctx, set).Err())
			require.NoError(t, rdb.Set(ctx, state, "x", 0).Err())
			for _, m := range tt.members {
				require.NoError(t, rdb.ZAdd(ctx, set, redis.Z{Member: m}).Err())
			}
			keys := make([][]byte, len(tt.keys))
			for i, k := range tt.keys {
				keys[i] = []byte(k)
			}
			joined, ok := joinedRange(keys)
			require.True(t, ok)
			n, err := clearRangeScript.Run(ctx, rdb, []string{set, set, state}, "", keys[0], keys[len(keys)-1], len(keys), joined).Int()
			require.NoError(t, err)
			left, err := rdb.ZCard(ctx, set).Result()
			require.NoError(t, err)
			stateLeft, err := rdb.Exists(ctx, state).Result()
			require.NoError(t, err)
			if tt.cleared {
				assert.Equal(t, len(tt.keys), n, "clearRangeScript's count")
				assert.Zero(t, left, "members left")
				assert.Zero(t, stateLeft, "state keys left")
				return
			}
			assert.Equal(t, -2, n, "clearRangeScript's result")
			assert.Equal(t, int64(len(tt.members)), left, "members left")
			assert.Equal(t, int64(1), stateLeft, "state keys left")
		})
	}
}

// TestSplitRun: the markers a run joined by newlines come apart at the
// newline after each one's prefix, which may hold newlines itself, each
// key ending at its capacity.
func TestSplitRun(t *testing.T) {
	t.Parallel()
	stamp := "00000001700000000000/"
	tests := []struct {
		name, prefix string
		keys         []string
	}{
		{"none", "runs/", nil},
		{"one", "runs/", []string{"runs/" + stamp + "a"}},
		{"three", "runs/", []string{"runs/" + stamp + "a", "runs/" + stamp + "b-c", "runs/" + stamp + "d"}},
		{"a prefix holding newlines", "r\nu\n", []string{"r\nu\n" + stamp + "a", "r\nu\n" + stamp + "b"}},
		{"an empty prefix", "", []string{stamp + "a", stamp + "b"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			keys := splitRun(tt.prefix, strings.Join(tt.keys, "\n"))
			got := make([]string, len(keys))
			for i, k := range keys {
				got[i] = string(k)
				assert.Equal(t, len(k), cap(k), "cap of key %d", i)
			}
			if tt.keys == nil {
				tt.keys = []string{}
			}
			assert.Equal(t, tt.keys, got, "splitRun(%q, ...)", tt.prefix)
		})
	}
}
