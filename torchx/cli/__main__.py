from torchx.cli.main import main

main()
