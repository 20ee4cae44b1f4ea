package ipamctl

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/hwipam/hwipam/pkg/store"
)

func storeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "store",
		Short: "Work on this node's store file (with ipam-node stopped)",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(storeExportCommand())
	return cmd
}

func storeExportCommand() *cobra.Command {
	var format, storeFile, out string
	var inPlace, keepClaims bool
	cmd := &cobra.Command{
		Use:   "export --format nv-ipam (--in-place | -o FILE)",
		Short: "Write the node's allocations as nv-ipam's JSON store, for a rollback to nv-ipam",
		Long: "export reads the store at --store-file, with ipam-node stopped on this node (it holds the store's lock,\n" +
			"and the export refuses to run beside it), and writes every allocation in nv-ipam's JSON store format,\n" +
			"with each pool's last reserved address and nv-ipam's checksum. --in-place puts the export at the store's\n" +
			"path, where nv-ipam's daemon reads it, and keeps the hwipam store as <store-file>.hwipam (its log as\n" +
			"<store-file>.hwipam.wal); -o writes a new file. A store that cannot be read fully is refused and nothing\n" +
			"is written; the file appears whole or not at all. A store with addresses of DRA claims (nic.hwipam.io) is\n" +
			"refused, naming their pods, unless --keep-dra-claims. See docs/migration.md, \"Rolling back to nv-ipam\".",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if format != "nv-ipam" {
				return usageErrorf("--format %q: the only format is nv-ipam", format)
			}
			switch {
			case inPlace && out != "":
				return usageErrorf("--in-place and -o exclude each other")
			case !inPlace && out == "":
				return usageErrorf("say where the export goes: --in-place (the rollback: nv-ipam reads it at --store-file) or -o FILE")
			case inPlace:
				out = storeFile
			case out == storeFile:
				return usageErrorf("-o names the store itself: use --in-place, which keeps the hwipam store as a backup")
			}
			rep, err := store.ExportNVIPAMWith(storeFile, out, store.ExportOptions{KeepClaims: keepClaims})
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "exported %d allocation(s) in %d pool(s) to %s in nv-ipam's format\n", rep.Allocations, rep.Pools, out)
			if rep.Backup != "" {
				fmt.Fprintf(w, "the hwipam store is kept as %s (and %s.wal)\n", rep.Backup, rep.Backup)
			}
			if rep.WithNetwork > 0 {
				fmt.Fprintf(w, "note: %d allocation(s) recorded their CNI network, which nv-ipam does not keep; "+
					"they are exported all the same\n", rep.WithNetwork)
			}
			if rep.Claims > 0 {
				fmt.Fprintf(w, "note: %d allocation(s) of DRA claims exported (--keep-dra-claims): nv-ipam holds their "+
					"addresses until their pods are gone; their NIC ports stay in those pods\n", rep.Claims)
			}
			if rep.WithRail > 0 {
				fmt.Fprintf(w, "note: %d allocation(s) were made through a rail; nv-ipam knows no rails: they are exported "+
					"in the pool the rail picked, and a network config with \"rail\" needs a poolName under nv-ipam\n", rep.WithRail)
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&format, "format", "", "output format; required: nv-ipam")
	fl.StringVar(&storeFile, "store-file", "/var/lib/cni/nv-ipam/store", "the store, as ipam-node's --store-file")
	fl.BoolVar(&inPlace, "in-place", false, "put the export at --store-file, keeping the hwipam store as <store-file>.hwipam")
	fl.StringVarP(&out, "output", "o", "", "write the export to this new file")
	fl.BoolVar(&keepClaims, "keep-dra-claims", false, "export the DRA driver's allocations too (their pods keep their addresses "+
		"under nv-ipam until they are gone); without it, a store that holds any is refused")
	return cmd
}
