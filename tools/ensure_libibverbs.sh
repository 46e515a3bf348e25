#!/bin/sh
# The Mooncake transfer engine (extra `pd`, part of `test`) links libibverbs.so.1 even for TCP transfers.
# Install Debian's libibverbs1 when the library is missing and we may (root with apt-get); otherwise say
# what to install and go on: only prefill/decode disaggregation needs it, everything else runs without.
if ldconfig -p 2>/dev/null | grep -q 'libibverbs\.so\.1 '; then
    exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: libibverbs.so.1 is missing (the Mooncake transfer engine needs it, even over TCP); installing libibverbs1 with apt-get"
    (apt-get install -y --no-install-recommends libibverbs1 || (apt-get update && apt-get install -y --no-install-recommends libibverbs1)) >/dev/null
    exit $?
fi
echo "setup: WARNING: libibverbs.so.1 is missing and this is not a root shell with apt-get." >&2
echo "setup: the Mooncake transfer engine (prefill/decode disaggregation) cannot load without it;" >&2
echo "setup: install your distribution's libibverbs package (Debian/Ubuntu: sudo apt-get install libibverbs1)." >&2
exit 0
