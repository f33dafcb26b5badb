// Package linehash is the 64-bit FNV-1a hash of lines of text that the
// modes keep instead of rules: byte by byte, so that hashing allocates
// nothing (hash/fnv's Write would take a []byte, and a string converted
// to one is copied).
package linehash

// Start is the hash of no lines, which Line continues.
const Start uint64 = 14695981039346656037

// Line continues h with line and a newline.
func Line[T ~string | []byte](h uint64, line T) uint64 {
	const prime = 1099511628211
	for i := 0; i < len(line); i++ {
		h = (h ^ uint64(line[i])) * prime
	}
	return (h ^ '\n') * prime
}
