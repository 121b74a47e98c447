// A map of N string keys to string values (N the first argument, default 3M), built in a
// shuffled order and then read back every third key: prints the entry count and an FNV-1a hash
// of the values read, which must be the same natively and under `tidepool run`. Built with
// default flags it is statically linked, and Go's runtime maps its heap with system calls of
// its own.
package main

import (
	"fmt"
	"hash/fnv"
	"os"
	"strconv"
)

func main() {
	n := 3000000
	if len(os.Args) > 1 {
		n, _ = strconv.Atoi(os.Args[1])
	}
	m := make(map[string]string, 0)
	for i := 0; i < n; i++ {
		k := "key-" + strconv.Itoa(i*7919%n)
		m[k] = k + "-value-" + strconv.Itoa(i)
	}
	h := fnv.New64a()
	for i := 0; i < n; i += 3 {
		h.Write([]byte(m["key-"+strconv.Itoa(i)]))
	}
	fmt.Printf("entries %d hash %x\n", len(m), h.Sum64())
}
