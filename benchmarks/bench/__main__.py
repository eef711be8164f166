from benchmarks.bench.run import main

main()
