// Package layering holds no code: its test checks that no package imports
// one on a higher floor (docs/DESIGN.md, "Code layout").
package layering
