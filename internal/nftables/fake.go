package nftables

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"
)

// Fake is a stateful Interface for tests. It holds the objects of an `nft
// -j list ruleset` document, as the real adapter would read them, and
// parses them on every list call, so tests can load a real capture, delete
// a table (what `nft delete table` or a firewall reload does) or add
// another table, and list again. It starts with an empty ruleset.
type Fake struct {
	mu      sync.Mutex
	objects []json.RawMessage
	err     error
	seq     uint64
	calls   int
	// Unavailable makes every call fail with ErrUnavailable (no nft).
	Unavailable bool
	// Now stamps snapshots (default time.Now).
	Now func() time.Time
}

var _ Interface = (*Fake)(nil)

// NewFake returns a Fake with an empty ruleset.
func NewFake() *Fake { return &Fake{} }

// SetRuleset replaces the ruleset with the objects of an nft -j document.
func (k *Fake) SetRuleset(doc string) error {
	objs, err := fakeObjects(doc)
	if err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.objects = objs
	return nil
}

// AddRuleset appends the objects of another nft -j document (its tables
// must not exist yet, as with `nft -f`).
func (k *Fake) AddRuleset(doc string) error {
	objs, err := fakeObjects(doc)
	if err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.objects = append(k.objects, objs...)
	return nil
}

// DeleteTable removes a table and everything in it; it reports whether the
// table existed.
func (k *Fake) DeleteTable(f Family, name string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	found := false
	kept := k.objects[:0:0]
	for _, raw := range k.objects {
		if fam, table, ok := objectTable(raw); ok && fam == f && table == name {
			found = true
			continue
		}
		kept = append(kept, raw)
	}
	k.objects = kept
	return found
}

// SetError makes every list call fail with err (nil clears it).
func (k *Fake) SetError(err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.err = err
}

// Calls returns how many list calls were made.
func (k *Fake) Calls() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.calls
}

// ListRuleset implements Interface.
func (k *Fake) ListRuleset(ctx context.Context) (*Snapshot, error) {
	return k.list(ctx, func(json.RawMessage) bool { return true })
}

// ListTable implements Interface.
func (k *Fake) ListTable(ctx context.Context, f Family, name string) (*Snapshot, error) {
	s, err := k.list(ctx, func(raw json.RawMessage) bool {
		fam, table, ok := objectTable(raw)
		return ok && fam == f && table == name
	})
	if err != nil {
		return nil, err
	}
	if s.Ruleset.Table(f, name) == nil {
		return nil, fmt.Errorf("nft -j list table %s %s (fake): %w", f, name, ErrNoTable)
	}
	return s, nil
}

func (k *Fake) list(ctx context.Context, keep func(json.RawMessage) bool) (*Snapshot, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.calls++
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if k.Unavailable {
		return nil, fmt.Errorf("%w: nft not installed (fake)", ErrUnavailable)
	}
	if k.err != nil {
		return nil, k.err
	}
	var buf bytes.Buffer
	buf.WriteString(`{"nftables": [{"metainfo": {"version": "1.0.6", "json_schema_version": 1}}`)
	for _, raw := range k.objects {
		if keep(raw) {
			buf.WriteString(",\n")
			buf.Write(raw)
		}
	}
	buf.WriteString("]}\n")
	size := int64(buf.Len())
	rs, err := Parse(&buf)
	if err != nil {
		return nil, fmt.Errorf("parsing nft output (fake): %w", err)
	}
	k.seq++
	now := time.Now
	if k.Now != nil {
		now = k.Now
	}
	return &Snapshot{Ruleset: rs, At: now(), Bytes: size, Seq: k.seq}, nil
}

// fakeObjects returns the objects of a document other than metainfo,
// checking that the document parses.
func fakeObjects(doc string) ([]json.RawMessage, error) {
	if _, err := ParseString(doc); err != nil {
		return nil, err
	}
	var d struct {
		Objects []json.RawMessage `json:"nftables"`
	}
	if err := json.Unmarshal([]byte(doc), &d); err != nil {
		return nil, err
	}
	out := d.Objects[:0:0]
	for _, o := range d.Objects {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(o, &m); err != nil {
			return nil, err
		}
		if _, meta := m["metainfo"]; meta {
			continue
		}
		out = append(out, o)
	}
	return out, nil
}

// objectTable returns the family and table an object belongs to (a
// table's own name for table objects).
func objectTable(raw json.RawMessage) (Family, string, bool) {
	var obj map[string]struct {
		Family Family `json:"family"`
		Table  string `json:"table"`
		Name   string `json:"name"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil {
		return "", "", false
	}
	for kind, o := range obj {
		if kind == "table" {
			return o.Family, o.Name, true
		}
		return o.Family, o.Table, true
	}
	return "", "", false
}
