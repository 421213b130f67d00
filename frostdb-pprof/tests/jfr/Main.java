// A program with one method of each kind a JFR recording should find on top: hotMethod burns
// CPU, allocatingMethod allocates, contendedLock is a monitor two threads fight over (each
// holds it asleep, so the other waits). The test records it with -XX:StartFlightRecording.
public class Main {
    static final Object LOCK = new Object();
    static volatile long sink;
    static volatile boolean running = true;

    static long hotMethod(long n) {
        long x = 1;
        for (long i = 0; i < n; i++) {
            x = x * 6364136223846793005L + 1442695040888963407L;
            x ^= x >>> 29;
        }
        return x;
    }

    static Object allocatingMethod() {
        byte[][] chunks = new byte[8][];
        for (int i = 0; i < chunks.length; i++) {
            chunks[i] = new byte[256 * 1024];
        }
        return chunks;
    }

    static void contendedLock() throws InterruptedException {
        synchronized (LOCK) {
            Thread.sleep(5);
        }
    }

    public static void main(String[] args) throws Exception {
        long millis = args.length > 0 ? Long.parseLong(args[0]) : 3000;
        Thread hot = new Thread(() -> {
            while (running) {
                sink += hotMethod(5_000_000);
            }
        }, "hot");
        Thread alloc = new Thread(() -> {
            while (running) {
                sink += allocatingMethod().hashCode();
                try {
                    Thread.sleep(5);
                } catch (InterruptedException e) {
                    return;
                }
            }
        }, "alloc");
        Thread[] lockers = new Thread[2];
        for (int t = 0; t < lockers.length; t++) {
            lockers[t] = new Thread(() -> {
                while (running) {
                    try {
                        contendedLock();
                    } catch (InterruptedException e) {
                        return;
                    }
                }
            }, "locker-" + t);
        }
        hot.start();
        alloc.start();
        for (Thread t : lockers) {
            t.start();
        }
        Thread.sleep(millis);
        running = false;
        hot.join();
        alloc.join();
        for (Thread t : lockers) {
            t.join();
        }
    }
}
