package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/remediate-dev/remediate/internal/boundedfile"
	"github.com/remediate-dev/remediate/internal/bundle"
	"github.com/remediate-dev/remediate/internal/termsafe"
)

func newBundleCmd(stdout, stderr io.Writer) *cobra.Command {
	bc := &cobra.Command{
		Use:   "bundle",
		Short: "Read an evidence bundle written by --once --bundle",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return usageErrorf("%q needs a subcommand: show", cmd.CommandPath())
		},
	}
	show := &cobra.Command{
		Use:   "show FILE",
		Short: "Print a bundle's manifest (each part checked) and its report",
		Long: `Print a bundle's manifest — each part with its size, how it was obtained, the
error if it could not be, whether it was cut — checked against the parts'
SHA-256, then the report it holds. Nothing is extracted: a bundle from anywhere
is read in memory, bounded, and anything but flat regular files is refused
and named. Exit 1 when the bundle cannot be read or something does not check.`,
		Example: "  remediate bundle show node1.tar.gz",
		Args:    exactlyOne("FILE"),
		ValidArgsFunction: func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
			return []string{"gz"}, cobra.ShellCompDirectiveFilterFileExt
		},
		RunE: func(_ *cobra.Command, args []string) error {
			return codeErr(showBundle(args[0], stdout, stderr))
		},
	}
	bc.AddCommand(show)
	return bc
}

func showBundle(path string, stdout, stderr io.Writer) int {
	f, err := boundedfile.Open(path)
	if err != nil {
		fmt.Fprintf(stderr, "Error: %v\n", err)
		return exitError
	}
	defer f.Close()
	b, rerr := bundle.Read(f, bundle.Limits{})
	if m := b.Manifest; m != nil {
		fmt.Fprintf(stdout, "Bundle %s: node %s, created %s, remediate %s, limit %d MiB\n\n", path, safe(m.Node),
			m.Created.UTC().Format("2006-01-02T15:04:05Z"), safe(m.Version), m.MaxBytes>>20)
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "FILE\tSIZE\tCHECK\tHOW\tNOTE")
		check := map[string]string{}
		for _, e := range b.Entries {
			check[e.Name] = e.Check
		}
		for _, p := range m.Parts {
			var note []string
			if p.Error != "" {
				note = append(note, "error: "+p.Error)
			}
			if p.Truncated {
				note = append(note, fmt.Sprintf("cut (%d+ bytes obtained)", p.Original))
			}
			if p.Redactions > 0 {
				note = append(note, fmt.Sprintf("%d redacted", p.Redactions))
			}
			c := check[p.Name]
			if c == "" {
				c = "missing"
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", safe(p.Name), p.Size, safe(c), safe(p.How), safe(strings.Join(note, "; ")))
		}
		tw.Flush()
	}
	if len(b.Problems) > 0 {
		fmt.Fprintln(stdout, "\nPROBLEMS:")
		for _, p := range b.Problems {
			fmt.Fprintf(stdout, "  %s\n", safe(p))
		}
	}
	if rep, ok := b.Kept[bundle.ReportTextName]; ok {
		fmt.Fprintf(stdout, "\n--- %s ---\n%s", bundle.ReportTextName, safeText(string(rep)))
	}
	if rerr != nil {
		fmt.Fprintf(stderr, "Error: %s: %v\n", path, rerr)
		return exitError
	}
	if len(b.Problems) > 0 {
		return exitError
	}
	return exitOK
}

// safe makes a string from a bundle printable on one line (a hostile
// bundle's terminal escapes shown escaped).
func safe(s string) string { return termsafe.Line(s) }

// safeText is safe for multi-line text: newlines and tabs stay.
func safeText(s string) string { return termsafe.Text(s) }
