package retention

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// MarkerKey returns the key of the marker for id finished at t under this
// sweep's prefix, checking id with the sweep's ValidateID. Use it instead of
// the package-level MarkerKey when Config.ValidateID is set.
func (s *Sweep) MarkerKey(t time.Time, id string) ([]byte, error) {
	if err := s.configured("MarkerKey"); err != nil {
		return nil, err
	}
	if err := s.checkID(id); err != nil {
		return nil, err
	}
	return appendKey(nil, s.prefix, t, id)
}

// checkID checks id by the sweep's rule. Its error matches ErrInvalidID,
// but for a Config.ValidateID that panicked, whose error matches
// errValidatePanicked alone: the panic says nothing of the id.
func (s *Sweep) checkID(id string) error {
	if s.validate == nil {
		return ValidateID(id)
	}
	if id == "" {
		return fmt.Errorf("%w: empty", ErrInvalidID)
	}
	if err := s.callValidate(id); err != nil {
		if errors.Is(err, errValidatePanicked) {
			return err // says nothing of the id
		}
		if !errors.Is(err, ErrInvalidID) {
			err = fmt.Errorf("%w: %s", ErrInvalidID, errString(err))
		}
		return err
	}
	return nil
}

// errValidatePanicked is the error of a Config.ValidateID that panicked: it
// says nothing of the id, so the marker is neither cleared nor deleted.
var errValidatePanicked = errors.New("retention: Config.ValidateID panicked")

// callValidate calls Config.ValidateID, turning a panic into an error.
func (s *Sweep) callValidate(id string) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w on %q: %v", errValidatePanicked, id, r)
		}
	}()
	return s.validate(id)
}

// Mark is the package-level Mark for the sweep's prefix, with id checked by
// the sweep's rule (Config.ValidateID) as Sweep.MarkerKey checks it. Its
// advice holds: where the store has transactions, write Sweep.MarkerKey's
// key in the transaction that records the entity's terminal state (the
// adapters' MarkKeyTx and MarkKeyOp take it).
func (s *Sweep) Mark(ctx context.Context, p Putter, id string, t time.Time) error {
	key, err := s.MarkerKey(t, id)
	if err != nil {
		return err
	}
	return p.Put(ctx, key, nil)
}

// checkIDBytes is checkID for the id of key, with key's malformed error.
func (s *Sweep) checkIDBytes(key, id []byte) error {
	if s.validate == nil && validID(id) {
		return nil // no string made
	}
	err := s.checkID(string(id))
	if err != nil && !errors.Is(err, errValidatePanicked) {
		return malformed(key, "id", err)
	}
	return err
}
