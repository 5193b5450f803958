#!/usr/bin/env python3
"""cu2cpp.py IN.cu OUT.cpp — rewrites the parts of CUDA C++ that are not C++, for cudasim.h.

  k<<<g, b[, smem[, stream]]>>>(args)
      -> cudasim::launch("k", ADDR, cudasim::Cfg{g, b, smem, stream},
                         [](auto &&...a_) { k(a_...); }, args)
     ADDR is (const void *)&k, the key cudaFuncSetAttribute uses, where `&k` names one function
     (k not a template, or its template arguments written out); nullptr otherwise.
  extern __shared__ T x[];      -> T *x = (T *)cudasim::dyn_smem();
  __shared__ T x[N], y;         -> T (&x)[N] = cudasim::shared_var<T[N]>(&site); T &y = ...;
                                   one static `site` per declaration: the block's arena keys on it
Lines are kept where they were (a `#line` and no added newlines), so errors point into IN.cu."""
import re
import sys


def matching(src, i, open_ch, close_ch):
    """Index just past the bracket closing the one opened before i."""
    depth = 1
    while depth:
        c = src[i]
        depth += (c == open_ch) - (c == close_ch)
        i += 1
    return i


def split_top(s):
    """s split at commas outside brackets."""
    parts, depth, cur = [], 0, ''
    for c in s:
        depth += (c in '([<{') - (c in ')]>}')
        if c == ',' and depth == 0:
            parts.append(cur)
            cur = ''
        else:
            cur += c
    return parts + [cur]


def rewrite(src, path):
    templated = set(re.findall(r'template\s*<[^;{]*?>\s*(?:static\s+)?(?:__global__\s+)(?:static\s+)?void\s+(\w+)', src)
                    + re.findall(r'template\s*<[^;{]*?>\s*(?:static\s+)?(?:__launch_bounds__\([^)]*\)\s*)?__global__\s+(?:__launch_bounds__\([^)]*\)\s*)?void\s+(\w+)', src))
    out, pos = [], 0
    launch = re.compile(r'([A-Za-z_]\w*(?:::\w+)*)(\s*<[^<>;()]*>)?\s*<<<(.*?)>>>\s*\(', re.S)
    while (m := launch.search(src, pos)):
        end = matching(src, m.end(), '(', ')')
        args = src[m.end():end - 1]
        name, targs = m.group(1), (m.group(2) or '').strip()
        kern = name + targs
        addr = f'(const void *)&{kern}' if targs or name not in templated else 'nullptr'
        label = kern.replace('"', '')
        out.append(src[pos:m.start()])
        out.append(f'cudasim::launch("{label}", {addr}, cudasim::Cfg{{{m.group(3)}}}, '
                   f'[](auto &&...a_) {{ {kern}(a_...); }}' + (f', {args})' if args.strip() else ')'))
        pos = end
    src = ''.join(out) + src[pos:]

    src = re.sub(r'extern\s+__shared__\s+(?:__align__\(\d+\)\s+)?([\w:]+(?:\s+[\w:]+)*?)\s+(?:__align__\(\d+\)\s+)?(\w+)\s*\[\s*\]\s*;',
                 r'\1 *\2 = (\1 *)cudasim::dyn_smem();', src)

    count = [0]

    def shared(m):
        decls = split_top(m.group(1))
        first = re.match(r'^(.*?)\b(\w+)\s*((?:\[[^\]]*\])*)\s*$', decls[0].strip(), re.S)
        if not first:
            sys.exit(f'{path}: cannot read the __shared__ declaration "{m.group(0)}"')
        typ = first.group(1).strip()
        items = [(first.group(2), first.group(3))]
        for d in decls[1:]:
            dm = re.match(r'^\s*(\w+)\s*((?:\[[^\]]*\])*)\s*$', d, re.S)
            if not dm:
                sys.exit(f'{path}: cannot read the __shared__ declarator "{d}"')
            items.append((dm.group(1), dm.group(2)))
        res = []
        for name, dims in items:
            count[0] += 1
            site = f'cudasim_site_{name}_{count[0]}'
            full = f'{typ}{dims}'
            ref = f'{typ} (&{name}){dims}' if dims else f'{typ} &{name}'
            res.append(f'static char {site}; {ref} = cudasim::shared_var<{full}>(&{site});')
        return ' '.join(res)

    src = re.sub(r'(?<!extern )\b__shared__\s+([^;]*);', shared, src)
    return src


if __name__ == '__main__':
    text = open(sys.argv[1]).read()
    with open(sys.argv[2], 'w') as f:
        f.write(f'#line 1 "{sys.argv[1]}"\n' + rewrite(text, sys.argv[1]))
