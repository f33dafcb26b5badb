// Package textfill fills words into lines for an 80-column terminal, as
// kube-proxy-explain prints its answers.
package textfill

import "strings"

// Width is the terminal's width the text is filled to.
const Width = 80

// Fill fills text's words into lines of at most Width columns, the first
// led by first and the others by rest; a word too long for a line gets a
// line of its own.
func Fill(text, first, rest string) string {
	var b strings.Builder
	line, empty := first, true
	for _, word := range strings.Fields(text) {
		if !empty && len(line)+1+len(word) > Width {
			b.WriteString(line + "\n")
			line, empty = rest, true
		}
		if !empty {
			line += " "
		}
		line += word
		empty = false
	}
	b.WriteString(line + "\n")
	return b.String()
}
