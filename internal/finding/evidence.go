package finding

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
)

// The evidence decoders: the one place that reads typed values back out of
// a finding's Evidence, accepting what a detector put there (any Go
// number) and what a JSON round trip (the journal, a report) turns it into
// (float64, json.Number, a decimal string).

// EvidenceString reads a non-empty string.
func EvidenceString(ev map[string]any, key string) (string, error) {
	v, ok := ev[key]
	if !ok {
		return "", fmt.Errorf("finding has no %q evidence", key)
	}
	s, ok := v.(string)
	if !ok || s == "" {
		return "", fmt.Errorf("evidence %q = %v is not a non-empty string", key, v)
	}
	return s, nil
}

// EvidenceInt reads an integer (a float64 only when it has no fraction and
// is exactly representable).
func EvidenceInt(ev map[string]any, key string) (int64, error) {
	v, ok := ev[key]
	if !ok {
		return 0, fmt.Errorf("finding has no %q evidence", key)
	}
	if i, ok := toInt(v); ok {
		return i, nil
	}
	return 0, fmt.Errorf("evidence %q = %v (%T) is not an integer", key, v, v)
}

// EvidenceNumber reads a number.
func EvidenceNumber(ev map[string]any, key string) (float64, error) {
	v, ok := ev[key]
	if !ok {
		return 0, fmt.Errorf("finding has no %q evidence", key)
	}
	switch x := v.(type) {
	case float64:
		return x, nil
	case float32:
		return float64(x), nil
	}
	if i, ok := toInt(v); ok {
		return float64(i), nil
	}
	return 0, fmt.Errorf("evidence %q is %T, not a number", key, v)
}

// EvidencePort reads a TCP/UDP port, 1..65535.
func EvidencePort(ev map[string]any, key string) (uint16, error) {
	p, err := EvidenceInt(ev, key)
	if err != nil {
		return 0, err
	}
	if p < 1 || p > 65535 {
		return 0, fmt.Errorf("evidence %q = %d is not a port", key, p)
	}
	return uint16(p), nil
}

func toInt(v any) (int64, bool) {
	switch x := v.(type) {
	case int:
		return int64(x), true
	case int8:
		return int64(x), true
	case int16:
		return int64(x), true
	case int32:
		return int64(x), true
	case int64:
		return x, true
	case uint:
		return int64(x), uint64(x) <= math.MaxInt64
	case uint8:
		return int64(x), true
	case uint16:
		return int64(x), true
	case uint32:
		return int64(x), true
	case uint64:
		return int64(x), x <= math.MaxInt64
	case float64:
		return int64(x), x == math.Trunc(x) && math.Abs(x) < 1<<53
	case json.Number:
		i, err := x.Int64()
		return i, err == nil
	case string:
		i, err := strconv.ParseInt(x, 10, 64)
		return i, err == nil
	}
	return 0, false
}
