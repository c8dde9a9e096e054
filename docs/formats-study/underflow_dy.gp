set terminal svg size 1000,480 font 'sans,11'
set output 'underflow_dy.svg'
set title 'ResNet-20, Fashion-MNIST (10 000 images), epoch 10, seed 1'
set ylabel 'dy values rounded to zero (%)'
set xtics rotate by -60 font ',8'
set key outside right
set grid ytics
set datafile missing 'NaN'
plot 'underflow_dy.dat' using 2:xtic(1) with linespoints title 'bf16', \
     'underflow_dy.dat' using 3:xtic(1) with linespoints title 'fp16', \
     'underflow_dy.dat' using 4:xtic(1) with linespoints title 'int16', \
     'underflow_dy.dat' using 5:xtic(1) with linespoints title 'int16-block128', \
     'underflow_dy.dat' using 6:xtic(1) with linespoints title 'int16-block64', \
     'underflow_dy.dat' using 7:xtic(1) with linespoints title 'int16-block32', \
     'underflow_dy.dat' using 8:xtic(1) with linespoints title 'fp8', \
     'underflow_dy.dat' using 9:xtic(1) with linespoints title 'mxfp8', \
     'underflow_dy.dat' using 10:xtic(1) with linespoints title 'mxint8', \
     'underflow_dy.dat' using 11:xtic(1) with linespoints title 'mxfp6', \
     'underflow_dy.dat' using 12:xtic(1) with linespoints title 'mxfp4', \
     'underflow_dy.dat' using 13:xtic(1) with linespoints title 'posit16', \
     'underflow_dy.dat' using 14:xtic(1) with linespoints title 'posit16es2'
