#!/bin/sh
# Render the Alertmanager template with the webhook URLs from the environment (see alertmanager.yml.tmpl).
#
#   DPSTREAM_PAGER_URL=https://… DPSTREAM_TICKET_URL=https://… render.sh [TEMPLATE [OUTPUT]]
#
# TEMPLATE defaults to alertmanager.yml.tmpl and OUTPUT to alertmanager.yml, both beside this script.
# Every ${NAME} in the template is replaced by the environment variable NAME, which must be one of
# DPSTREAM_PAGER_URL and DPSTREAM_TICKET_URL, set, non-empty, an http(s) URL without quotes or whitespace.
# The output is written atomically with mode 0600 (it holds secrets) and, if amtool is on PATH, checked with
# `amtool check-config`. Exit 0 on success, 2 on a usage or value error, 1 if amtool rejects the result.
# POSIX sh and awk only, so it also runs inside the busybox-based Alertmanager image.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
template=${1:-$here/alertmanager.yml.tmpl}
output=${2:-$here/alertmanager.yml}

fail() { echo "render.sh: $*" >&2; exit 2; }

[ -r "$template" ] || fail "$template: no such template: give the path of alertmanager.yml.tmpl"
for name in DPSTREAM_PAGER_URL DPSTREAM_TICKET_URL; do
    eval "value=\${$name:-}"
    [ -n "$value" ] || fail "$name is not set: export the webhook URL of the receiver and run again"
    case $value in
        http://*|https://*) ;;
        *) fail "$name: not an http(s) URL: give the receiver's full webhook URL" ;;
    esac
    case $value in
        *"'"*|*'"'*|*' '*|*'	'*) fail "$name: contains a quote or whitespace: URL-encode it" ;;
    esac
done

tmp="$output.tmp.$$"
trap 'rm -f "$tmp"' EXIT
umask 077
awk '
{
    line = $0; out = ""
    while ((i = index(line, "${")) > 0) {
        rest = substr(line, i + 2)
        j = index(rest, "}")
        if (j == 0) { printf "render.sh: line %d: unterminated ${\n", NR > "/dev/stderr"; exit 2 }
        name = substr(rest, 1, j - 1)
        if (name != "DPSTREAM_PAGER_URL" && name != "DPSTREAM_TICKET_URL") {
            printf "render.sh: line %d: unknown variable ${%s}: only DPSTREAM_PAGER_URL and DPSTREAM_TICKET_URL\n", NR, name > "/dev/stderr"
            exit 2
        }
        out = out substr(line, 1, i - 1) ENVIRON[name]
        line = substr(rest, j + 1)
    }
    print out line
}' "$template" > "$tmp"

if command -v amtool >/dev/null 2>&1; then
    if ! amtool check-config "$tmp" >/dev/null; then
        echo "render.sh: amtool check-config rejected the rendered $output" >&2
        exit 1
    fi
fi
mv "$tmp" "$output"
trap - EXIT
echo "render.sh: wrote $output"
