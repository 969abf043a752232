// kroce-libcni-gc runs CNI GC for one network configuration list through
// the real libcni (Debian's golang-github-appc-cni-dev 1.3.0), as container
// runtimes do: libcni reads its attachment cache, then calls each plugin's
// GC with "cni.dev/valid-attachments" set to the attachments given here.
// With "null" (what a runtime has when no sandbox is left) libcni sends
// JSON null.
//
// Usage: kroce-libcni-gc CONFLIST BIN_DIRS(colon-separated) CACHE_DIR VALID_JSON
// Exit 0 on success; otherwise the error on stderr and exit 1.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
)

func main() {
	if len(os.Args) != 5 {
		fmt.Fprintln(os.Stderr, "usage: kroce-libcni-gc CONFLIST BIN_DIRS CACHE_DIR VALID_JSON")
		os.Exit(2)
	}
	list, err := libcni.ConfListFromFile(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var valid []types.GCAttachment
	if err := json.Unmarshal([]byte(os.Args[4]), &valid); err != nil {
		fmt.Fprintf(os.Stderr, "VALID_JSON: %v\n", err)
		os.Exit(2)
	}
	cni := libcni.NewCNIConfigWithCacheDir(strings.Split(os.Args[2], ":"), os.Args[3], nil)
	if err := cni.GCNetworkList(context.Background(), list, &libcni.GCArgs{ValidAttachments: valid}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
