"""The extraction tests' detector, as `pipeline extract` flags: a ResNet-18 trunk of width 16 on
images resized to 96-160 pixels (at the presets' 600-1000 a test took ~4 s on two cores)."""

TINY_DETECTOR = ["--set", "detector.depth=18", "--set", "detector.width=16",
                 "--set", "detector.rpn_hidden=32", "--set", "preprocess.min_size=96",
                 "--set", "preprocess.max_size=160"]
