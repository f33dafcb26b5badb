package textfill

import "testing"

func TestFill(t *testing.T) {
	long := "aaaaaaaaaa bbbbbbbbbb cccccccccc dddddddddd eeeeeeeeee ffffffffff gggggggggg hhhhhhhhhh"
	want := "- aaaaaaaaaa bbbbbbbbbb cccccccccc dddddddddd eeeeeeeeee ffffffffff gggggggggg\n  hhhhhhhhhh\n"
	if got := Fill(long, "- ", "  "); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	word := string(make([]byte, 0)) + "x" + string(make([]byte, 90))
	if got := Fill("a "+word, "", ""); got != "a\n"+word+"\n" {
		t.Errorf("a word longer than a line: %q", got)
	}
}
