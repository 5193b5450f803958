#!/usr/bin/env bash
# make docs: the documents a clone has are the only ones anything points to (issue 28).
#   1. README.md and docs/*.md never point outside the repository (../shared/...), and nothing
#      tracked cites the team's internal documents (DESIGN.md, FORMATS.md, BUDGETS.md,
#      STYLE.md, RELIABILITY.md), which a clone does not have.
#   2. Every repository path README.md and docs/*.md name (core/x.c, scripts/x.sh, docs/x.md,
#      tests/data/..., a folder) exists, and so does every relative Markdown link target.
#   3. Every citation of a section, docs/NAME.md "Section" (or 'Section', or NAME.md, "Section"
#      inside docs/), in a tracked file names a heading that NAME.md has.
# Fails naming each file, line and what is missing. Not checked: paths with a wildcard or a {a,b}
# list, placeholders in capitals (configs/NAME.json), and a path in another repository, written
# as owner/name `path`.
set -euo pipefail
cd "$(dirname "$0")/.."

bad=0
fail() { echo "check_docs: $*" >&2; bad=1; }
docs=(README.md docs/*.md)

# 1. Pointers outside the clone.
while IFS= read -r hit; do
    fail "$hit: points outside the repository (../shared is not in a clone)"
done < <(grep -nH -F '../shared' "${docs[@]}" || true)
while IFS= read -r hit; do
    fail "$hit: cites a document a clone does not have (use docs/design.md, formats.md or memory.md)"
done < <(git grep -nE '\b(DESIGN|FORMATS|BUDGETS|STYLE|RELIABILITY)\.md\b' -- . ':!scripts/check_docs.sh' || true)

# 2. Repository paths and relative links.
roots='\.ci|configs|core|data|docs|lora|model|moe|optim|plan|quant|scripts|tests|trainer'
for f in "${docs[@]}"; do
    while IFS=: read -r line path; do
        path=${path%%[.,;:)]}
        path=${path%%[.,;:)]}
        [[ $path == *[\*\{\<]* || $path =~ /[A-Z_]+(\.|/|$) ]] && continue
        [[ -e $path ]] || fail "$f:$line: names '$path', which is not in the repository"
    done < <(sed -E 's#[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+ `[^`]*`#(another repository)#g' "$f" |
             grep -noP "(?<![\w./\-])(?:$roots)/[\w./\-*{}<>]*" || true)
    dir=$(dirname "$f")
    while IFS=: read -r line target; do
        target=${target#](}
        target=${target%)}
        target=${target%%#*}
        [[ -z $target || $target == *://* || $target == mailto:* ]] && continue
        [[ -e $dir/$target ]] || fail "$f:$line: links '$target', which is not in the repository"
    done < <(grep -noP '\]\([^) ]+\)' "$f" || true)
done

# 3. Cited sections exist.
titles() { sed -n 's/^#\{1,6\} \{1,\}//p' "$1" | sed 's/ *$//'; }
cite='(?:docs/[a-z-]+\.md|(?<![\w/.-])(?:design|formats|memory|families|gpu-check|gpu-results)\.md)(?:\x27s)?,? \(?(?:"[^"]+"|\x27[^\x27]+\x27)' 
while IFS=: read -r src line text; do
    while IFS= read -r c; do
        doc=${c%%.md*}.md
        [[ $doc == docs/* ]] || doc=docs/$doc
        title=${c#*.md}
        title=${title#\'s}
        title=${title#,}
        title=${title# }
        title=${title#(}
        title=${title:1:${#title}-2}
        if [[ ! -f $doc ]]; then
            fail "$src:$line: cites $doc, which is not in the repository"
        elif ! grep -qxF -- "$title" <(titles "$doc"); then
            fail "$src:$line: cites $doc \"$title\", which has no such heading"
        fi
    done < <(grep -oP "$cite" <<<"$text")
done < <(git grep -nP "$cite" -- . ':!scripts/check_docs.sh' || true)

exit $bad
