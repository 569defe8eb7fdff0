"""What a stored run goes out as (``variantlab export``): a variant's model as Hugging Face
``save_pretrained`` output (:mod:`.variant`, through :mod:`variantlab.hf`) and the run's
results logged to MLflow (:mod:`.mlflow`)."""
