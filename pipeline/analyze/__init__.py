"""`pipeline analyze grounding`: which attention heads of a trained model ground the words of a
caption in the image's regions (Li et al. 2020, "What Does BERT with Vision Look At?", §3),
measured on Flickr30K Entities."""
