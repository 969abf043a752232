#!/usr/bin/env bash
# The whole test suite, as CI runs it (README: "Run every test").
# Root is needed for the netns tests (CNI, e2e); without it they say they
# were skipped.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
export CARGO_TERM_COLOR=never

target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
# Each step's header says how much disk is left: a CI machine's disk is not
# ours to size, and running out reads as a compile error.
step() {
  printf '\n=== %s\n' "$*"
  mkdir -p "$target_dir"
  printf 'disk: %s free, target dir %s\n' \
    "$(df -h --output=avail "$target_dir" | tail -n 1 | tr -d ' ')" \
    "$(du -sh "$target_dir" 2>/dev/null | cut -f1)"
}

step "set-up (installs what is missing; see ci/setup.sh)"
setup_env=$(ci/setup.sh)
eval "$setup_env"
printf '%s\n' "$setup_env"

step "format"
cargo fmt --all --check

# KROCE_PRUNE=1 (.ci/run sets it): what a later step no longer needs is
# removed as soon as it is done with: clippy's metadata builds (own target
# dir) and the release build, once its binaries are copied out. A CI
# machine's disk is shared; a developer's target dir is kept whole.
prune=${KROCE_PRUNE:-0}
clippy_target=$target_dir
[ "$prune" = 1 ] && clippy_target=$target_dir/clippy

step "clippy (all targets, warnings are errors; the shipped binaries without features)"
CARGO_TARGET_DIR=$clippy_target cargo clippy --workspace --all-targets --all-features -- -D warnings
CARGO_TARGET_DIR=$clippy_target cargo clippy --workspace --bins -- -D warnings
[ "$prune" = 1 ] && rm -rf "$clippy_target"

step "build binaries"
cargo build --workspace --all-features --bins

# What the images ship: release profile, default features. The end-to-end
# tests run these (KROCE_BIN_DIR), not the test-feature builds.
step "build of the shipped binaries (release, default features)"
cargo build --workspace --release --bins
export KROCE_BIN_DIR=$target_dir/release

step "shell scripts"
shellcheck e2e/kind/*.sh images/*.sh images/perftest/kroce-gid-index ci/*.sh
bash -n e2e/kind/run.sh

step "helm chart"
ci/check-chart.sh

if [ "${KROCE_SKIP_IMAGES:-0}" != 1 ]; then
  step "container images (podman, no registry)"
  # The release binaries, as the images ship; the images are removed after
  # the check (KROCE_KEEP_IMAGES=1 keeps them).
  PROFILE=release images/check.sh
fi

if [ "$prune" = 1 ]; then
  step "release build: keep the binaries, drop the rest"
  mkdir -p "$target_dir/shipped"
  find "$target_dir/release" -maxdepth 1 -type f -perm -u+x -exec cp {} "$target_dir/shipped/" \;
  rm -rf "$target_dir/release"
  export KROCE_BIN_DIR=$target_dir/shipped
  ls "$KROCE_BIN_DIR"
fi

step "real kernel in a VM (QEMU igb SR-IOV + rxe, Linux 7.3; the shipped binaries)"
# One boot runs every check (ci/vm.sh, e2e/vm/guest.sh); e2e/tests/vm.rs
# reads the results back and asserts, in the workspace tests below. Runs
# after the prune: KROCE_BIN_DIR is then the copied-out shipped dir.
vm_results=$target_dir/vm-results
# The guest also runs the whole-node flow (e2e/tests/vm_guest) from the vm
# test binary, built here (the workspace tests below reuse the build).
KROCE_VM_GUEST_TEST=$(cargo test -p kroce-e2e --all-features --test vm --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "vm":
        print(m["executable"])')
export KROCE_VM_GUEST_TEST
echo "VM guest test binary: ${KROCE_VM_GUEST_TEST:-none (build failed: the VM tier will miss its node-e2e steps)}"
vm_start=$(date +%s)
ci/vm.sh "$vm_results" || echo "VM tier: ci/vm.sh failed; e2e/tests/vm.rs reports what the guest saw"
echo "VM tier: $(($(date +%s) - vm_start)) s"
export KROCE_VM_RESULTS=$vm_results

step "cargo test (workspace)"
out=$(mktemp)
set +e
cargo test --workspace --all-features --no-fail-fast 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
set -e
passed=$(grep -Eo 'test result: [a-zA-Z]+\. [0-9]+ passed' "$out" | awk '{s+=$4} END {print s+0}')
failed=$(grep -Eo '[0-9]+ failed' "$out" | awk '{s+=$1} END {print s+0}')
echo
echo "${passed} passed, ${failed} failed"
[ "$failed" = 0 ] && [ "$rc" = 0 ]
