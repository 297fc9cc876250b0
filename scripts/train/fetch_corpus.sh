#!/bin/sh
# Writes the training corpus: the King James Version of the Bible (1611;
# public domain), as packaged by Debian in bible-kjv-text (the text) and
# bible-kjv (the program that prints it).
#
#   scripts/train/fetch_corpus.sh OUT.txt
#
# Needs apt-get (Debian or a derivative) and network access to its mirror.
# Nothing is installed: the packages are downloaded and unpacked into a
# temporary folder. The text is printed verse by verse; train.py turns it
# into chapters and splits it.
set -eu
out=${1:?usage: fetch_corpus.sh OUT.txt}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download bible-kjv-text bible-kjv >/dev/null)
for deb in "$work"/*.deb; do
    dpkg-deb -x "$deb" "$work/root"
done
# -l0: one verse per line; -m: room for the whole book at once.
"$work/root/usr/bin/bible" -p "$work/root/usr/lib" -l0 -m 8192 "Gen1:1-Rev22:21" >"$out.tmp"
# The whole text has 31102 verses; a short dump means the program failed.
verses=$(grep -c '^  [0-9][0-9]* ' "$out.tmp" || true)
if [ "$verses" -ne 31102 ]; then
    echo "fetch_corpus: expected 31102 verses, got $verses" >&2
    exit 1
fi
mv "$out.tmp" "$out"
echo "fetch_corpus: $out ($(wc -c <"$out") bytes, $verses verses)"
