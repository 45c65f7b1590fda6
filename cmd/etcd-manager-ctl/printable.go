package main

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Whoever can write the backup store chooses much of what the ctl prints:
// command IDs and statuses, the spec, discovery addresses, and what agents
// repeat from them. A terminal acts on some characters instead of showing
// them: ESC starts a sequence that can clear the screen, move the cursor,
// retitle the window or, in some terminals, write a file; CR and BS
// overwrite what was printed; bidi overrides reorder it. The ctl prints
// text from the store only through printable (by way of fprintf), which
// turns every such character into a visible escape.

// printable returns s with each character a terminal could act on
// replaced by a Go-style escape: \x1b for ESC, \r, \n and \t for those,
// \u202e for a bidi override, and \xff for each byte that is not UTF-8.
// Everything else, non-ASCII letters included, is kept as it is.
func printable(s string) string { return escape(s, false) }

// printableLines is printable keeping line breaks and tabs: for the ctl's
// own multi-line messages, such as errors that join several.
func printableLines(s string) string { return escape(s, true) }

func escape(s string, keepLines bool) string {
	if utf8.ValidString(s) && !strings.ContainsFunc(s, func(r rune) bool { return unsafeRune(r, keepLines) }) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case !unsafeRune(r, keepLines):
			b.WriteString(s[i : i+n])
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x100:
			fmt.Fprintf(&b, `\x%02x`, r)
		default:
			fmt.Fprintf(&b, `\u%04x`, r)
		}
		i += n
	}
	return b.String()
}

// unsafeRune reports whether a terminal could act on r rather than show
// it: the C0 and C1 controls and DEL, the invisible format characters
// (bidi overrides and isolates, zero-width marks) and the line and
// paragraph separators.
func unsafeRune(r rune, keepLines bool) bool {
	switch {
	case keepLines && (r == '\n' || r == '\t'):
		return false
	case r < 0x20 || r == 0x7f || (r >= 0x80 && r <= 0x9f):
		return true
	}
	return unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp)
}

// fprintf is fmt.Fprintf for formats that are the ctl's own and arguments
// that may come from the store: every string, error and fmt.Stringer
// argument is made printable first. Use %s or %v for those (not %d).
func fprintf(w io.Writer, format string, args ...any) error {
	safe := make([]any, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case string:
			safe[i] = printable(v)
		case error:
			safe[i] = printable(v.Error())
		case fmt.Stringer:
			safe[i] = printable(v.String())
		default:
			safe[i] = a
		}
	}
	_, err := fmt.Fprintf(w, format, safe...)
	return err
}

// jsonSafe rewrites the characters a terminal could act on that
// encoding/json leaves raw (C1 controls, bidi and other format
// characters; it escapes C0 itself) as \uXXXX escapes. In a JSON document
// such characters can only stand inside strings, where the escape means
// the same character, so the document decodes to the same values.
// encoding/json writes only valid UTF-8. writeYAML's documents hold such
// characters only inside double-quoted strings, where the escape means
// the same too.
func jsonSafe(doc []byte) []byte {
	if !bytes.ContainsFunc(doc, func(r rune) bool { return r >= 0x7f && unsafeRune(r, false) }) {
		return doc
	}
	var b bytes.Buffer
	for i := 0; i < len(doc); {
		r, n := utf8.DecodeRune(doc[i:])
		if r >= 0x7f && unsafeRune(r, false) {
			fmt.Fprintf(&b, `\u%04x`, r)
		} else {
			b.Write(doc[i : i+n])
		}
		i += n
	}
	return b.Bytes()
}
