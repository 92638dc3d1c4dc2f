"""`pipeline plot`: every curve of a run drawn, with legends that cover none of them."""

import json

from matplotlib.backends.backend_agg import FigureCanvasAgg
from PIL import Image

from pipeline.cli import main
from pipeline.train.plot import loss_figure

TASKS = ("attr", "feat", "itm", "mlm", "obj", "qa")


def records():
    """A pretraining run's metrics.jsonl: eight losses a step, a validation every 100 steps."""
    rows = []
    for step in range(0, 401, 20):
        rows.append({"step": step, "epoch": 0, "lr": 1e-4, "loss": 4 - step / 200,
                     **{f"loss_{t}": 1 - step / 1000 for t in TASKS}})
        if step % 100 == 0:
            rows.append({"step": step, "split": "val", "loss": 4.2 - step / 200,
                         "loss_mlm": 1.1 - step / 1000, "qa_acc": step / 500,
                         "itm_acc": 0.5 + step / 1000})
    return rows


def test_legends_stand_outside_every_axes_and_inside_the_figure():
    fig = loss_figure(records(), "run")
    canvas = FigureCanvasAgg(fig)
    canvas.draw()  # lays the figure out: the extents below are the drawn ones
    renderer = canvas.get_renderer()
    axes = fig.get_axes()
    data_areas = [ax.get_window_extent(renderer) for ax in axes]
    labels = []
    for ax in axes:
        legend = ax.get_legend()
        box = legend.get_window_extent(renderer)
        assert not any(box.overlaps(area) for area in data_areas), (box, data_areas)
        assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1
        assert fig.bbox.y0 <= box.y0 and box.y1 <= fig.bbox.y1
        labels.append([text.get_text() for text in legend.get_texts()])
    assert labels == [
        ["loss", "loss (val)", *(f"loss_{t}" for t in TASKS[:3]), "loss_mlm", "loss_mlm (val)",
         *(f"loss_{t}" for t in TASKS[4:])],
        ["itm_acc", "qa_acc"],
    ]


def test_cli_writes_the_png_into_the_run(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records()))
    assert main(["plot", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"{tmp_path / 'loss_curves.png'}\n"
    assert Image.open(tmp_path / "loss_curves.png").size == (1430, 495)  # 13 x 4.5 in at 110 dpi


def test_fine_tuning_metrics_fill_the_accuracy_panel():
    """Fine-tuning validates with the task's official metric (VQA `score`, NLVR2 `accuracy`,
    VCR `q_a` / `qa_r`): each is drawn, none of the record's other fields."""
    for metrics in ({"score": 0.4}, {"accuracy": 0.6}, {"q_a": 0.3, "qa_r": 0.2}):
        rows = [{"step": 50, "epoch": 0, "lr": 1e-5, "loss": 1.0, "loss_task": 1.0},
                {"step": 50, "split": "val", "loss": 1.1, "loss_task": 1.1, "pairs": 96,
                 **metrics}]
        accuracy_axes = loss_figure(rows, "run").get_axes()[1]
        assert [t.get_text() for t in accuracy_axes.get_legend().get_texts()] == sorted(metrics)


def test_a_directory_that_is_no_run_is_one_line(tmp_path, capsys):
    (tmp_path / "feats").mkdir()
    for missing in (tmp_path / "nope", tmp_path / "feats"):
        assert main(["plot", str(missing)]) == 2
        err = capsys.readouterr().err
        assert err == (f"pipeline plot: {missing / 'metrics.jsonl'}: missing (is {missing} the "
                       "directory of a `pipeline pretrain` or `pipeline finetune` run?)\n")
    (tmp_path / "metrics.jsonl").write_text("{not json\n")
    assert main(["plot", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith(f"pipeline plot: {tmp_path / 'metrics.jsonl'}:1: ")


def test_a_run_shorter_than_log_every_shows_its_one_training_point():
    """A run of fewer steps than log_every logs its last step only: drawn as a line, one point
    left the panel without a training curve (fine-tuning NLVR2 on the world)."""
    rows = [{"step": 12, "epoch": 0, "lr": 1e-5, "loss": 0.7, "loss_pair": 0.7},
            {"step": 12, "split": "val", "loss": 0.69, "loss_pair": 0.69, "accuracy": 0.5}]
    ax_loss = loss_figure(rows, "run").get_axes()[0]
    train = [line for line in ax_loss.get_lines() if line.get_label() == "loss"]
    assert len(train) == 1 and train[0].get_marker() == "o"
