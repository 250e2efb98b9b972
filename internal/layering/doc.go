// Package layering holds no code: its test checks that no package imports
// one on a higher floor (README, "Code layout").
package layering
