// Glob patterns over original tool names (tool names have no path separators, so `*` matches
// any run of characters).
//
//   *        any run of characters, also empty      ?       one character
//   [abc]    one of a, b, c; ranges [a-z]           [!a-z]  (or [^a-z]) none of them
//   {a,b}    either alternative (may nest)          \x      x itself
//
// Patterns are compiled to anchored regular expressions once; an invalid pattern is an error
// that names it.

// Every character but letters and digits is written as a \u{...} escape, so nothing in a
// pattern can mean anything to the regular expression engine.
function escape(ch) {
  return /^[A-Za-z0-9]$/.test(ch) ? ch : `\\u{${ch.codePointAt(0).toString(16)}}`;
}

/** Compiles one pattern to a RegExp source (without anchors); throws a message on error. */
export function globSource(pattern) {
  let out = '';
  let depth = 0;
  const chars = [...pattern];
  for (let i = 0; i < chars.length; i += 1) {
    const c = chars[i];
    if (c === '\\') {
      if (i + 1 >= chars.length) throw 'it ends in an unescaped backslash';
      i += 1;
      out += escape(chars[i]);
    } else if (c === '*') {
      while (chars[i + 1] === '*') i += 1;
      out += '[^]*';
    } else if (c === '?') {
      out += '[^]';
    } else if (c === '[') {
      let j = i + 1;
      let negate = false;
      if (chars[j] === '!' || chars[j] === '^') {
        negate = true;
        j += 1;
      }
      // One (possibly escaped) character of the class, or undefined at the end of the pattern.
      const take = () => {
        if (chars[j] === '\\') j += 1;
        const ch = chars[j];
        j += 1;
        return ch;
      };
      let body = '';
      let first = true;
      for (;;) {
        if (j >= chars.length) throw 'a [ is never closed';
        if (chars[j] === ']' && !first) break;
        first = false;
        const from = take();
        if (from === undefined) throw 'a [ is never closed';
        if (chars[j] === '-' && chars[j + 1] !== undefined && chars[j + 1] !== ']') {
          j += 1;
          const to = take();
          if (to === undefined) throw 'a [ is never closed';
          if (to.codePointAt(0) < from.codePointAt(0)) throw `the range ${from}-${to} is reversed`;
          body += `${escape(from)}-${escape(to)}`;
        } else {
          body += escape(from);
        }
      }
      out += negate ? `[^${body}]` : `[${body}]`;
      i = j;
    } else if (c === '{') {
      depth += 1;
      out += '(?:';
    } else if (c === '}' && depth > 0) {
      depth -= 1;
      out += ')';
    } else if (c === ',' && depth > 0) {
      out += '|';
    } else {
      out += escape(c);
    }
  }
  if (depth > 0) throw 'a { is never closed';
  return out;
}

/** A matcher for one pattern; throws `invalid pattern "p": why` when it cannot be compiled. */
export function compileGlob(pattern) {
  if (typeof pattern !== 'string') throw `invalid pattern ${JSON.stringify(pattern)}: not a string`;
  let source;
  try {
    source = globSource(pattern);
  } catch (why) {
    throw `invalid pattern ${JSON.stringify(pattern)}: ${why}`;
  }
  let re;
  try {
    re = new RegExp(`^(?:${source})$`, 'u');
  } catch (e) {
    throw `invalid pattern ${JSON.stringify(pattern)}: ${e && e.message ? e.message : e}`;
  }
  return (name) => re.test(name);
}

/**
 * Include/exclude filters: when `include` is non-empty a tool must match one of its patterns;
 * a tool matching any `exclude` pattern is never published (exclude wins). Returns null when
 * there is nothing to filter (every tool passes). Throws a message naming the first invalid
 * pattern.
 */
export function compileFilters(include, exclude) {
  const compile = (patterns, what) =>
    patterns.map((p) => {
      try {
        return compileGlob(p);
      } catch (why) {
        throw `${what}: ${why}`;
      }
    });
  const inc = compile(include, 'include');
  const exc = compile(exclude, 'exclude');
  if (inc.length === 0 && exc.length === 0) return null;
  return (name) => (inc.length === 0 || inc.some((m) => m(name))) && !exc.some((m) => m(name));
}
