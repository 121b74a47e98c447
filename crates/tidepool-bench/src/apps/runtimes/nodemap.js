// A Map of N string keys to string values (default 3M) and 100 Buffers (4 MiB each at 3M)
// filled with a pattern, built on V8's heap and beside it, then read back: prints the entry
// count and a checksum, which must be the same natively and under `tidepool run`.
const n = Number(process.argv[2] || 3000000);
const m = new Map();
for (let i = 0; i < n; i++) {
  const k = "key-" + ((i * 7919) % n);
  m.set(k, k + "-value-" + i);
}
const buffers = [];
for (let b = 0; b < 100; b++) {
  const buf = Buffer.alloc(Math.max(4096, Math.floor((4 * 1048576 * n) / 3000000)));
  for (let i = 0; i < buf.length; i += 4096) buf[i] = (b + i / 4096) & 0xff;
  buffers.push(buf);
}
let sum = 0;
for (let i = 0; i < n; i += 3) {
  const v = m.get("key-" + i);
  for (let j = 0; j < v.length; j++) sum = (sum * 31 + v.charCodeAt(j)) >>> 0;
}
for (const buf of buffers) for (let i = 0; i < buf.length; i += 4096) sum = (sum + buf[i]) >>> 0;
console.log("entries " + m.size + " sum " + sum);
