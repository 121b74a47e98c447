// A HashMap of N Integer keys to String values and 200 long arrays of N/100 elements each,
// built on the heap of a JVM with more heap than local memory, then read back: prints the
// entry count and a checksum, which must be the same natively and under `tidepool run`.
import java.util.HashMap;

public class JvmMap {
    public static void main(String[] args) {
        int n = args.length > 0 ? Integer.parseInt(args[0]) : 4_000_000;
        HashMap<Integer, String> m = new HashMap<>();
        for (int i = 0; i < n; i++) {
            int k = (int) ((i * 2654435761L) % n);
            m.put(k, "value-" + i);
        }
        long[][] arrays = new long[200][];
        for (int a = 0; a < arrays.length; a++) {
            arrays[a] = new long[Math.max(1, n / 100)];
            for (int i = 0; i < arrays[a].length; i++) arrays[a][i] = (long) a * i + 7;
        }
        long sum = 0;
        for (int i = 0; i < n; i += 3) sum = sum * 31 + m.get(i).hashCode();
        for (long[] a : arrays) for (int i = 0; i < a.length; i += 97) sum += a[i];
        System.out.println("entries " + m.size() + " sum " + sum);
    }
}
