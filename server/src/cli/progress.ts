/**
 * Progress of long CLI operations on stderr (stdout stays clean for data).
 *
 * When stderr is a terminal a cli-progress bar appears once the operation has
 * run for a second (small inputs never flash a bar): with a percentage and
 * ETA when the input size is known (stdin is a file), with a count and rate
 * otherwise. When stderr is not a terminal (CI logs, files) a plain line is
 * printed every five seconds instead.
 */
import cliProgress from "cli-progress";

/** Receives progress of an operation over messages read from an input. */
export interface ProgressReporter {
  /** Bytes of input consumed (for the percentage when the size is known). */
  addBytes(bytes: number): void;
  /** Messages done so far. */
  update(messages: number): void;
  /** Removes the bar or stops the periodic lines. Idempotent. */
  stop(): void;
}

/** How long an operation runs before progress is shown, in milliseconds. */
const SHOW_AFTER_MS = 1000;
/** Interval of the plain progress lines, in milliseconds. */
const LINE_EVERY_MS = 5000;

/**
 * Starts reporting the progress of an operation named `label`; `totalBytes`
 * is the input size when known.
 */
export function startProgress(label: string, totalBytes?: number): ProgressReporter {
  const started = Date.now();
  let bytes = 0;
  let messages = 0;
  const rate = () => {
    const seconds = (Date.now() - started) / 1000;
    return seconds > 0 ? Math.round(messages / seconds) : 0;
  };

  if (!process.stderr.isTTY) {
    let stopped = false;
    const timer = setInterval(() => {
      process.stderr.write(`${label}: ${messages} messages (${rate()}/s)\n`);
    }, LINE_EVERY_MS);
    timer.unref();
    return {
      addBytes(n) {
        bytes += n;
      },
      update(n) {
        messages = n;
      },
      stop() {
        if (stopped) return;
        stopped = true;
        clearInterval(timer);
      },
    };
  }

  const known = totalBytes !== undefined && totalBytes > 0;
  const bar = new cliProgress.SingleBar(
    {
      format: known
        ? `${label} [{bar}] {percentage}% | {messages} messages | {rate}/s | ETA {eta_formatted}`
        : `${label} | {messages} messages | {rate}/s | {duration_formatted}`,
      stream: process.stderr,
      hideCursor: true,
      clearOnComplete: false,
      etaBuffer: 50,
      fps: 5,
    },
    cliProgress.Presets.shades_classic,
  );
  let active = false;
  let stopped = false;
  const show = setTimeout(() => {
    if (stopped) return;
    active = true;
    bar.start(known ? totalBytes : 1, known ? bytes : 0, { messages, rate: rate() });
  }, SHOW_AFTER_MS);
  show.unref();
  return {
    addBytes(n) {
      bytes += n;
    },
    update(n) {
      messages = n;
      if (active) bar.update(known ? Math.min(bytes, totalBytes) : 0, { messages, rate: rate() });
    },
    stop() {
      if (stopped) return;
      stopped = true;
      clearTimeout(show);
      if (active) {
        bar.update(known ? Math.min(bytes, totalBytes) : 0, { messages, rate: rate() });
        bar.stop();
      }
    },
  };
}
