package retention

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// orderID is a custom id rule: "order." and digits.
func orderID(id string) error {
	digits, ok := strings.CutPrefix(id, "order.")
	if !ok || digits == "" || strings.Trim(digits, "0123456789") != "" {
		return fmt.Errorf("%q is not order.<digits>", id)
	}
	return nil
}

// TestSweepMarkCustomRule writes markers through Sweep.Mark under a sweep
// whose ValidateID differs from the default, and has a Pass clear them.
func TestSweepMarkCustomRule(t *testing.T) {
	t.Parallel()
	tests := []struct {
		id      string
		wantErr error // from Sweep.Mark; nil: written and cleared
		pkgErr  error // from the package-level Mark, which knows only the default rule
	}{
		{id: "order.42", pkgErr: ErrInvalidID},
		{id: "order.7", pkgErr: ErrInvalidID},
		{id: "order-7", wantErr: ErrInvalidID},
		{id: "", wantErr: ErrInvalidID, pkgErr: ErrInvalidID},
	}
	for _, tt := range tests {
		t.Run(tt.id, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			kv := NewMemKV()
			c := newClears()
			s, clock := newSweep(t, kv, Config{Prefix: "orders/done/", Clear: c.clear, ValidateID: orderID})

			// The package-level Mark knows only the default rule.
			err := Mark(ctx, NewMemKV(), "orders/done/", tt.id, clock.Now())
			require.ErrorIs(t, err, tt.pkgErr, "Mark(%q) = %v, want %v", tt.id, err, tt.pkgErr)

			err = s.Mark(ctx, kv, tt.id, clock.Now())
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr, "Sweep.Mark(%q) = %v, want %v", tt.id, err, tt.wantErr)
				assert.Zero(t, kv.Len(), "a refused Sweep.Mark wrote a key")
				return
			}
			require.NoError(t, err, "Sweep.Mark(%q)", tt.id)
			want, err := s.MarkerKey(clock.Now(), tt.id)
			require.NoError(t, err)
			require.True(t, has(t, kv, want), "Sweep.Mark did not write Sweep.MarkerKey's key %q", want)

			clock.Advance(time.Hour + time.Millisecond)
			st, err := s.Pass(ctx)
			require.NoError(t, err)
			assert.Equal(t, 1, st.Cleared, "Pass() cleared %d, want 1", st.Cleared)
			assert.Equal(t, 1, c.count(tt.id), "Clear(%q) calls", tt.id)
			assert.Zero(t, kv.Len(), "the marker is still there after the Pass")
		})
	}
}
