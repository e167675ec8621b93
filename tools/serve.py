#!/usr/bin/env python
"""Serve the artifact behind OpenAI's audio API on Ray Serve: ``POST /v1/audio/transcriptions`` and
``/v1/audio/translations`` (multipart: file, model, language, prompt, response_format, temperature,
timestamp_granularities[]), and ``GET /health``. Concurrent requests are batched by ``serve.batch`` into one
batched ``generate`` per set of options.

    python -m tools.serve --model heads/whisper-tiny.en --port 8000
    curl 127.0.0.1:8000/v1/audio/transcriptions -F file=@talk.wav -F model=whisper-tiny.en -F response_format=srt

response_format: json ({"text"}), text, srt, vtt (the transcription command's renderers), verbose_json (language,
duration, segments with their times; words with timestamp_granularities[]=word). temperature 0 (the default):
Medusa's greedy decoding with Whisper's fallback, as the command decodes, so the text is the command's;
temperature > 0: the base model samples (Medusa drafts greedy decoding only), which the response says (verbose_json
"decoding", and every response's X-Medusa-Decoding header). Errors: 4xx with OpenAI's {"error": {"message"}} body.
"""

# (no `from __future__ import annotations`: FastAPI reads the handlers' annotations, whose names are local)
import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

from tools import audio_io, cli_args, runtime, transcribe
from tools.speech_batch import DecodeOptions, ModelOptions, Result, SpeechBatcher

EPILOG = """\
Replicas and GPUs: --replicas and --gpus-per-replica here, or Serve's own config for a cluster
(`serve build tools.serve:app_builder -o serve.yaml`, edit num_replicas / ray_actor_options of the Transcriptions
deployment, `serve run serve.yaml` or `serve deploy serve.yaml`); arguments of app_builder: model, base, device,
dtype, medusa, max_batch_size, batch_wait_s, max_upload_mb. Several machines: `ray start --head` on one,
`ray start --address HEAD_IP:6379` on the others, then this command with --address auto on the head.
"""

FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
FIELDS = {"transcriptions": {"file", "model", "language", "prompt", "response_format", "temperature",
                             "timestamp_granularities[]"},
          "translations": {"file", "model", "prompt", "response_format", "temperature"}}
GRANULARITIES = ("segment", "word")
MAX_UPLOAD_MB = 25  # OpenAI's limit
MEDIA_TYPES = {"json": "application/json", "verbose_json": "application/json", "text": "text/plain",
               "srt": "application/x-subrip", "vtt": "text/vtt"}


class RequestError(Exception):
    """A request the server cannot take: its HTTP status and one line saying what to change."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


def served_name(model: str) -> str:
    """The name clients pass as ``model``: the artifact's folder name or Hub repo name."""
    return Path(model.rstrip("/")).name


# --------------------------------------------------------------------------- one request


def read_options(form, endpoint: str, name: str, max_bytes: int):
    """(upload bytes, file name, DecodeOptions, response_format) from a multipart form, or RequestError."""
    unknown = sorted(set(form.keys()) - FIELDS[endpoint])
    if unknown:
        raise RequestError(400, f"unknown field {unknown[0]!r} for /v1/audio/{endpoint}; this server takes "
                                f"{', '.join(sorted(FIELDS[endpoint]))}", unknown[0])
    upload = form.get("file")
    if upload is None or not hasattr(upload, "read"):
        raise RequestError(400, "no audio: send the recording as the multipart field 'file'", "file")
    model = form.get("model")
    if model not in (name, "whisper-1"):
        raise RequestError(404, f"model {model!r} is not served here; pass model={name!r}", "model")
    response_format = form.get("response_format") or "json"
    if response_format not in FORMATS:
        raise RequestError(400, f"response_format {response_format!r} is not one of {', '.join(FORMATS)}",
                           "response_format")
    granularities = form.getlist("timestamp_granularities[]") or ["segment"]
    if set(granularities) - set(GRANULARITIES):
        raise RequestError(400, f"timestamp_granularities[] takes {' and '.join(GRANULARITIES)}",
                           "timestamp_granularities[]")
    words = "word" in granularities
    if words and response_format != "verbose_json":
        raise RequestError(400, "word timestamps come with response_format=verbose_json", "response_format")
    try:
        temperature = float(form.get("temperature") or 0)
    except ValueError:
        raise RequestError(400, "temperature must be a number from 0 to 1", "temperature") from None
    if not 0 <= temperature <= 1:
        raise RequestError(400, "temperature must be a number from 0 to 1", "temperature")
    options = DecodeOptions(language=form.get("language") or None, prompt=form.get("prompt") or None,
                            task="translate" if endpoint == "translations" else None, word_timestamps=words,
                            temperature=temperature or None)
    return upload, options, response_format


def decode_upload(data: bytes, filename: str):
    """The upload as 16 kHz mono samples (the command's decoding), or RequestError naming the problem."""
    suffix = Path(filename or "").suffix.lower()
    if suffix not in audio_io.SUPPORTED_EXTENSIONS:
        suffix = ".wav"  # a name without a known extension: libsndfile, then PyAV, sniff the content
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"upload{suffix}"
        path.write_bytes(data)
        try:
            return audio_io.load_audio(path)
        except audio_io.AudioError as error:
            raise RequestError(400, f"file {filename!r}: {error.problem}; send a recording in one of "
                                    f"{', '.join(sorted(audio_io.SUPPORTED_EXTENSIONS))}", "file") from None


def decoding_note(options: DecodeOptions, result: Result, medusa: bool) -> str:
    if options.temperature:
        return (f"base model sampling at temperature {options.temperature:g} (Medusa drafts greedy decoding only; "
                "generate fell back to the base's own)")
    if not medusa:
        return "base model greedy (Medusa off on this server)"
    return f"medusa greedy (draft {result.draft})" if result.draft else "base model (generate fell back)"


def render(response_format: str, result: Result, options: DecodeOptions, duration: float, note: str):
    """The response body in ``response_format``, through the command's renderers."""
    if response_format == "text":
        return audio_io.render_txt(result.text)
    if response_format == "srt":
        return audio_io.render_srt(result.segments)
    if response_format == "vtt":
        return audio_io.render_vtt(result.segments)
    if response_format == "json":
        return {"text": result.text}
    segments = [{"id": i, "seek": 0, "temperature": options.temperature or 0.0, "tokens": [],
                 **{k: v for k, v in row.items() if k != "words"}}
                for i, row in enumerate(result.segment_rows(words=False))]
    body = {"task": "translate" if options.task == "translate" else "transcribe", "language": result.language,
            "duration": round(duration, 3), "text": result.text, "segments": segments, "decoding": note}
    if options.word_timestamps:
        body["words"] = [word for row in result.segment_rows(words=True) for word in row["words"]]
    return body


# --------------------------------------------------------------------------- the deployment


def make_deployment():
    """The Serve deployment class (made here so that importing this module needs neither Ray nor FastAPI)."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response
    from ray import serve

    app = FastAPI(title="Medusa ASR (OpenAI audio API)")

    def error_response(error: RequestError):
        return JSONResponse({"error": {"message": error.message, "type": "invalid_request_error",
                                       "param": error.param, "code": None}}, status_code=error.status)

    @serve.deployment(name="Transcriptions", max_ongoing_requests=64)
    @serve.ingress(app)
    class Transcriptions:
        def __init__(self, model_options: dict, max_batch_size: int = 16, batch_wait_s: float = 0.05,
                     max_upload_mb: float = MAX_UPLOAD_MB):
            self.batcher = SpeechBatcher(ModelOptions(**model_options), max_batch_size)
            self.name = served_name(self.batcher.model_name)
            self.max_bytes = int(max_upload_mb * 1024 * 1024)
            self.decode.set_max_batch_size(max_batch_size)
            self.decode.set_batch_wait_timeout_s(batch_wait_s)

        @app.get("/health")
        def health(self):
            return {"status": "ok", "model": self.name}

        @app.get("/v1/models")
        def models(self):
            return {"object": "list", "data": [{"id": self.name, "object": "model", "owned_by": "medusa-asr"}]}

        @app.post("/v1/audio/transcriptions")
        async def transcriptions(self, request: Request):
            return await self.handle(request, "transcriptions")

        @app.post("/v1/audio/translations")
        async def translations(self, request: Request):
            return await self.handle(request, "translations")

        async def handle(self, request: Request, endpoint: str):
            try:
                size = int(request.headers.get("content-length") or 0)
                if size > self.max_bytes:
                    raise RequestError(413, f"upload of {size / 2**20:.1f} MB is over this server's "
                                            f"{self.max_bytes / 2**20:g} MB; send a shorter or compressed recording")
                try:
                    form = await request.form()
                except Exception as error:  # noqa: BLE001 - a body that is not a multipart form
                    raise RequestError(400, f"the body is not a multipart form ({error}); send multipart/form-data "
                                            "with a 'file' field") from None
                upload, options, response_format = read_options(form, endpoint, self.name, self.max_bytes)
                data = await upload.read()
                if len(data) > self.max_bytes:
                    raise RequestError(413, f"upload over this server's {self.max_bytes / 2**20:g} MB; send a "
                                            "shorter or compressed recording", "file")
                samples = await asyncio.to_thread(decode_upload, data, upload.filename)
                try:
                    options = self.batcher.check(options)
                except ValueError as error:
                    raise RequestError(400, " ".join(str(error).split())) from None
                result = await self.decode((samples, options))
                if result.error:
                    raise RequestError(422, f"file {upload.filename!r}: {result.error}", "file")
            except RequestError as error:
                return error_response(error)
            note = decoding_note(options, result, self.batcher.options.medusa)
            body = render(response_format, result, options, audio_io.duration_seconds(samples), note)
            headers = {"X-Medusa-Decoding": note}
            if isinstance(body, dict):
                return JSONResponse(body, headers=headers)
            return Response(body, media_type=MEDIA_TYPES[response_format], headers=headers)

        @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.05)
        async def decode(self, jobs: list[tuple]) -> list[Result]:
            """Concurrent requests: one batched generate per set of options, off the event loop."""
            return await asyncio.to_thread(self.decode_jobs, jobs)

        def decode_jobs(self, jobs: list[tuple]) -> list[Result]:
            results: list[Result | None] = [None] * len(jobs)
            for options in dict.fromkeys(options for _, options in jobs):
                rows = [i for i, (_, o) in enumerate(jobs) if o == options]
                for i, result in zip(rows, self.batcher.transcribe([jobs[i][0] for i in rows], options)):
                    results[i] = result
            return results

    return Transcriptions


def app_builder(args: dict):
    """The application for ``serve run tools.serve:app_builder model=... device=...`` and Serve config files
    (which may set num_replicas and ray_actor_options themselves); ``replicas`` / ``gpus_per_replica`` /
    ``cpus_per_replica`` here are the command line's."""
    model_options = {"model": args.get("model") or transcribe.default_model_path(), "base": args.get("base"),
                     "device": args.get("device", "cpu"), "dtype": args.get("dtype", "auto"),
                     "medusa": str(args.get("medusa", True)).lower() not in ("0", "false", "no"),
                     "threads": int(args["threads"]) if args.get("threads") else None}
    deployment = make_deployment()
    if "replicas" in args:
        gpus = float(args.get("gpus_per_replica") or 0)
        cpus = 0 if gpus else float(args.get("cpus_per_replica") or 1)
        deployment = deployment.options(num_replicas=int(args["replicas"]),
                                        ray_actor_options={"num_gpus": gpus, "num_cpus": cpus})
    return deployment.bind(model_options, int(args.get("max_batch_size", 16)), float(args.get("batch_wait_s", 0.05)),
                           float(args.get("max_upload_mb", MAX_UPLOAD_MB)))


def start(model: str | None = None, *, host: str = "127.0.0.1", port: int = 8000, replicas: int = 1,
          gpus_per_replica: float = 0.0, cpus_per_replica: float = 1.0, blocking: bool = False, **args):
    """Run the application on the connected Ray cluster (a local one where there is none); returns its handle."""
    from ray import serve

    serve.start(http_options={"host": host, "port": port})
    application = app_builder({"model": model, "replicas": replicas, "gpus_per_replica": gpus_per_replica,
                               "cpus_per_replica": cpus_per_replica, **args})
    return serve.run(application, name="medusa-asr", route_prefix="/", blocking=blocking)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tools.serve", description=__doc__.split("\n\n")[0],
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None,
                        help=f"Hub repo id or local folder with the heads (default: {transcribe.DEFAULT_MODEL}); "
                        "clients pass its folder name as model")
    parser.add_argument("--base", default=None, help="base model folder or Hub id (default: the one the heads name)")
    parser.add_argument("--device", default="cpu", help="each replica's device: cpu or cuda (default: cpu)")
    parser.add_argument("--dtype", default="auto", type=runtime.dtype_name, help="float32, bfloat16, float16, auto")
    parser.add_argument("--threads", type=runtime.positive_int, default=None, help="torch CPU threads per replica")
    parser.add_argument("--no-medusa", action="store_true", help="plain greedy decoding, heads unused")
    parser.add_argument("--host", type=str, default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=cli_args.Number(int, 1, 65535), default=8000, help="(default: 8000)")
    parser.add_argument("--replicas", type=runtime.positive_int, default=1, help="model replicas (default: 1)")
    parser.add_argument("--gpus-per-replica", type=cli_args.positive_float, default=None,
                        help="GPUs per replica (default: 1 with --device cuda, else 0)")
    parser.add_argument("--max-batch-size", type=runtime.positive_int, default=16,
                        help="requests batched into one generate (default: 16)")
    parser.add_argument("--batch-wait-s", type=cli_args.non_negative_float, default=0.05,
                        help="how long a batch waits for more requests (default: 0.05 s)")
    parser.add_argument("--max-upload-mb", type=cli_args.positive_float, default=MAX_UPLOAD_MB, help="(default: 25)")
    parser.add_argument("--address", default=None, help="Ray cluster to join (auto: the one `ray start` made here)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import ray

    gpus = args.gpus_per_replica if args.gpus_per_replica is not None else (1.0 if args.device.startswith("cuda")
                                                                             else 0.0)
    ray.init(address=args.address)
    try:
        start(args.model, host=args.host, port=args.port, replicas=args.replicas, gpus_per_replica=gpus,
              blocking=True, base=args.base, device=args.device, dtype=args.dtype, threads=args.threads,
              medusa=not args.no_medusa, max_batch_size=args.max_batch_size, batch_wait_s=args.batch_wait_s,
              max_upload_mb=args.max_upload_mb)
    except KeyboardInterrupt:
        return 0
    except Exception as error:  # a replica that could not load the model
        print(f"error: the server could not start: {' '.join(str(error).split())[:500]}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
