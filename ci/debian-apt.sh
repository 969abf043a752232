# shellcheck shell=bash
# Sourced by ci/real-peers.sh and ci/vm-peers.sh: fetch Debian packages at
# pinned versions through a private apt configuration (own sources list,
# lists and cache: nothing is installed system-wide), dpkg -x them into a
# cache directory keyed by version.
#
# Debian's unstable and backports suites drop superseded versions within
# weeks (snapshot.debian.org is not reachable from CI): a pin that is gone
# falls back to the suite's current version of the same package, with a
# warning naming both versions, instead of failing the run.
#
# The mirror is the machine's own (its apt sources), never written here.

# debian_mirror: the first Debian archive URI in the machine's apt sources
# (deb822 .sources first, then sources.list), security archive excluded.
debian_mirror() {
  local uri
  uri=$(
    {
      cat /etc/apt/sources.list.d/*.sources 2>/dev/null |
        awk 'tolower($1) == "uris:" { for (i = 2; i <= NF; i++) print $i }' || true
      cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
        awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i !~ /^\[/ && $i !~ /\]$/ && $i !~ /=/) { print $i; break } }'
    } | grep -v -e security -e '^cdrom:' | head -n 1
  ) || true
  if [ -z "$uri" ]; then
    echo "debian-apt: no Debian mirror in /etc/apt/sources.list.d/*.sources or /etc/apt/sources.list" >&2
    return 1
  fi
  echo "${uri%/}"
}

# apt_init DIR SUITE...: a private apt configuration in DIR whose sources
# are the machine's mirror at SUITE (main); its lists are refreshed once per
# process. Call it outside subshells (it records that it ran).
declare -A debian_apt_ready=()
apt_init() {
  local dir=$1
  shift
  [ -n "${debian_apt_ready[$dir]:-}" ] && return 0
  local mirror s
  mirror=$(debian_mirror)
  mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial" "$dir/sources.list.d"
  : >"$dir/status"
  : >"$dir/sources.list"
  for s in "$@"; do
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $s main" >>"$dir/sources.list"
  done
  apt_private "$dir" update -qq >&2
  debian_apt_ready[$dir]=1
}

apt_private() {
  local dir=$1
  shift
  apt-get \
    -o "Dir::Etc::sourcelist=$dir/sources.list" \
    -o "Dir::Etc::sourceparts=$dir/sources.list.d" \
    -o "Dir::State::Lists=$dir/lists" \
    -o "Dir::Cache=$dir/cache" \
    -o "Dir::State::status=$dir/status" \
    -o "APT::Sandbox::User=root" "$@"
}

apt_cache_private() {
  local dir=$1
  shift
  apt-cache \
    -o "Dir::Etc::sourcelist=$dir/sources.list" \
    -o "Dir::Etc::sourceparts=$dir/sources.list.d" \
    -o "Dir::State::Lists=$dir/lists" \
    -o "Dir::Cache=$dir/cache" \
    -o "Dir::State::status=$dir/status" "$@"
}

# resolve_pins APTDIR SUITE PKG=VER...: prints one PKG=VER a line, the pinned
# version where the suite still has it, else its current one (warned, both
# versions named). Fails only if the package itself is gone.
resolve_pins() {
  local dir=$1 suite=$2
  shift 2
  apt_init "$dir" "$suite"
  local spec pkg want have
  for spec in "$@"; do
    pkg=${spec%%=*}
    want=${spec#*=}
    [ "$pkg" = "$spec" ] && want=
    # (apt-cache show PKG=VER exits 0 for a version it does not have.)
    if [ -n "$want" ] && apt_cache_private "$dir" madison "$pkg" 2>/dev/null |
      awk -F'|' -v v="$want" '{ gsub(/ /, "", $2) } $2 == v { f = 1 } END { exit !f }'; then
      echo "$pkg=$want"
      continue
    fi
    have=$(apt_cache_private "$dir" policy "$pkg" 2>/dev/null | awk '$1 == "Candidate:" { print $2 }')
    if [ -z "$have" ] || [ "$have" = "(none)" ]; then
      echo "debian-apt: $pkg is not in Debian $suite at all" >&2
      return 1
    fi
    [ -n "$want" ] &&
      echo "debian-apt: WARNING: $pkg $want (pinned) is no longer in Debian $suite; using its current version $have (move the pin)" >&2
    echo "$pkg=$have"
  done
}

# unpack_into APTDIR SUITE DEST PKG=VER...: downloads exactly these versions
# and dpkg -x's them all into DEST (once: DEST/.complete marks a finished
# unpack). Fails if any is not there.
unpack_into() {
  local dir=$1 suite=$2 dest=$3
  shift 3
  [ -f "$dest/.complete" ] && return 0
  apt_init "$dir" "$suite"
  rm -rf "$dest.tmp" && mkdir -p "$dest.tmp/debs"
  (cd "$dest.tmp/debs" && apt_private "$dir" download -qq "$@" >&2) || {
    echo "debian-apt: cannot download the $# packages for $dest from Debian $suite" >&2
    rm -rf "$dest.tmp"
    return 1
  }
  # apt-get download has been seen to exit 0 having fetched nothing.
  local got
  got=$(find "$dest.tmp/debs" -name '*.deb' | wc -l)
  if [ "$got" != $# ]; then
    echo "debian-apt: asked for $# packages for $dest, got $got .deb files" >&2
    rm -rf "$dest.tmp"
    return 1
  fi
  local deb
  for deb in "$dest.tmp/debs/"*.deb; do
    dpkg -x "$deb" "$dest.tmp" && rm "$deb"
  done
  rm -rf "$dest.tmp/debs" "$dest"
  mv "$dest.tmp" "$dest"
  touch "$dest/.complete"
}

# fetch_unpack APTDIR SUITE DEST_PREFIX PKG=VER...: unpacks the pinned
# versions into DEST_PREFIX-<first package's version>; where a pin is gone,
# the suite's current versions instead (warned, both versions named), in a
# directory keyed by the version used. Sets $fetched to the directory. A
# complete pinned directory is used without asking the network anything.
fetched=
fetch_unpack() {
  local dir=$1 suite=$2 prefix=$3
  shift 3
  fetched="$prefix-${1#*=}"
  [ -f "$fetched/.complete" ] && return 0
  unpack_into "$dir" "$suite" "$fetched" "$@" 2>/dev/null && return 0
  apt_init "$dir" "$suite"
  local specs
  mapfile -t specs < <(resolve_pins "$dir" "$suite" "$@")
  [ "${#specs[@]}" = $# ] || return 1
  fetched="$prefix-${specs[0]#*=}"
  unpack_into "$dir" "$suite" "$fetched" "${specs[@]}"
}
